"""What the PyTorch sides and plots of `tdc bench` share: the result file written atomically, and
matplotlib's headless import with a clear message when it is missing."""
import json
import os
import sys


def write_json(path, payload):
    """Writes payload as JSON to path through a temporary name (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"-> {path}", file=sys.stderr)


def import_pyplot(script):
    """matplotlib.pyplot on the Agg backend, or exit naming `script` and how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"{script}: matplotlib is missing ({e}): run ./tdc setup, or "
                 f"{sys.executable} -m pip install matplotlib")
    return plt
