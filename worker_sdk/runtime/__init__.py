"""What runs behind ``resume()`` and ``step()`` in a rank: settings, the channel to the
supervisor, the flight recorder, determinism checks, exit hooks, the loss and replica checks."""
