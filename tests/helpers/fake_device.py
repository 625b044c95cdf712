"""A fake device for the device timer's pure logic (worker_sdk/runtime/device_wait.py): timing
events on one in-order stream whose clock and progress the test sets, and which fail loudly when
asked to wait or to time an event the device has not reached."""

from __future__ import annotations


class FakeDevice:
    """One stream: every recorded event gets the next sequence number and the device's time;
    ``done`` is how many recorded events the device has completed (the test moves it)."""

    def __init__(self, tick_ms: float = 0.0) -> None:
        self.now_ms = 0.0
        self.tick_ms = tick_ms  # the device's time advances by this much at each record
        self.recorded = 0
        self.done = 0
        self.created = 0
        self.fail_record = False
        self.waited = False

    def event(self) -> FakeEvent:
        """A new timing event (counted: the ring must not allocate per collective)."""
        self.created += 1
        return FakeEvent(self)

    def run(self, ms: float) -> None:
        """The device spends ``ms`` on the collective being timed."""
        self.now_ms += ms

    def finish(self) -> None:
        """The device completes everything recorded so far."""
        self.done = self.recorded


class FakeEvent:
    """A timing event of :class:`FakeDevice`."""

    def __init__(self, device: FakeDevice) -> None:
        self.device = device
        self.seq = -1
        self.at_ms = 0.0

    def record(self) -> None:
        """Recorded at the device's present time, after everything recorded before."""
        if self.device.fail_record:
            raise RuntimeError("record failed")
        self.seq = self.device.recorded
        self.device.recorded += 1
        self.at_ms = self.device.now_ms
        self.device.now_ms += self.device.tick_ms

    def query(self) -> bool:
        """Whether the device has completed this event (never waits)."""
        return 0 <= self.seq < self.device.done

    def elapsed_time(self, end_event: FakeEvent) -> float:
        """Milliseconds to ``end_event``; like CUDA, an error unless both are completed."""
        if not (self.query() and end_event.query()):
            raise RuntimeError("elapsed_time of an event the device has not completed")
        return end_event.at_ms - self.at_ms

    def synchronize(self) -> None:
        """Waiting for the device is what the step path must never do."""
        self.device.waited = True
        raise AssertionError("synchronize() called: the step path waited for the device")
