"""The daemon as a service: the control socket (:mod:`.control`), systemd's sd_notify
(:mod:`.sdnotify`)."""

__all__ = ["control", "sdnotify"]
