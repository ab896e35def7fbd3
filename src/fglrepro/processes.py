"""Whether a process is alive: shared by ``fgl-train`` (it stops when its workflow is gone) and the
workflow's lock hint (:mod:`fglrepro.progress`). A module of its own, so that the workflow-side
:mod:`fglrepro.progress` stays out of the training code's source closure (and its code digest).
"""

from __future__ import annotations

from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel
        import os

        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
