"""What the Python test scripts share: checks that record a failure and go on, so that one run
reports every failure, and the norm-wise relative error they compare with. Imported after a
script's own import checks (numpy, torch, ...), which exit 77 (SKIPPED) where those are missing."""
import sys
import threading

failures = []
_lock = threading.Lock()  # some scripts check from several threads


def expect(cond, what):
    if not cond:
        with _lock:
            failures.append(what)
        print("FAILED:", what)


def _f64(x):
    import numpy as np
    if hasattr(x, "detach"):  # a torch tensor, of any dtype numpy has no name for (bf16)
        return x.detach().double().cpu().numpy()
    return np.asarray(x, np.float64)


def rel(got, want):
    """||got - want|| / ||want|| in float64, for torch tensors or anything numpy takes."""
    import numpy as np
    got, want = _f64(got), _f64(want)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def finish(success):
    """Exits 1 naming how many checks failed, else prints `success`."""
    if failures:
        print(len(failures), "failure(s)")
        sys.exit(1)
    print(success)
