"""The contract between the supervisor and the ranks: torch-free, standard library (and pyzmq for
the CURVE keys of the TCP listeners, :mod:`.curve`) only.

The only part of ``worker_sdk`` the supervisor imports (``tests/supervisor/test_architecture.py``
enforces it): the wire format, its authentication and the environment variables and exit codes
(:mod:`.protocol`), the typed messages (:mod:`.messages`, which reads and writes the classes
of :mod:`.lifecycle_messages`, :mod:`.checkpoint_messages` and :mod:`.training_messages`), and
where runs and checkpoints live on disk (:mod:`.layout`).
"""
