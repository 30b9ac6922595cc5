"""A one-line progress bar on stderr when it is a terminal (nothing otherwise)."""
import sys
import time


class ProgressBar:
    def __init__(self, total, label="", width=30, stream=None):
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.start = time.monotonic()

    def update(self, done, note=""):
        if not self.enabled:
            return
        filled = int(self.width * done / max(self.total, 1))
        elapsed = time.monotonic() - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else 0.0
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} "
                          f"{rate:.1f} it/s, {left:.0f} s left {note}\033[K")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
