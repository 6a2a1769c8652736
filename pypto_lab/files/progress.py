"""Progress bars for the work that can take seconds (numerics on the CPU, calibrations, sweeps,
validation runs): `progress(...)` is `tqdm.auto`'s bar, with two changes for notebooks.

* A saved notebook shows the bar as it ended, not as it began. tqdm's notebook widget stores its
  plain-text view once, when it is displayed ("0/12" for good, on GitHub or in any static view);
  this bar is displayed with a display id and updated when it closes, so the stored text is its
  last state ("12/12 [00:41, 3.4 s/pt]").
* ``delay`` (seconds, as tqdm's) is honoured the same way: a bar appears only once its work has
  run that long, so quick calls print nothing and slow ones never sit silent.

Like `files.atomic`, it imports nothing else of pypto_lab, so every stage may use it.
"""

from __future__ import annotations

from tqdm.auto import tqdm as _auto_tqdm


def _notebook_bar_class():
    try:
        from tqdm.notebook import tqdm_notebook
    except ImportError:   # pragma: no cover - ipywidgets missing: tqdm.auto is the text bar
        return None
    if not (isinstance(_auto_tqdm, type) and issubclass(_auto_tqdm, tqdm_notebook)):
        return None

    class StoredNotebookBar(_auto_tqdm):
        """tqdm's notebook bar, displayed with a display id (after ``delay``) and re-displayed
        when it closes."""

        def __init__(self, *args, **kwargs):
            self._handle = None
            kwargs["display"] = False
            super().__init__(*args, **kwargs)
            if not self.disable and hasattr(self, "container") and self.delay <= 0:
                self._show()

        def _show(self) -> None:
            from IPython.display import display

            self._handle = display(self.container, display_id=True)
            self.displayed = True

        def display(self, *args, check_delay: bool = True, **kwargs):
            if (check_delay and self.delay > 0 and not self.displayed and hasattr(self, "container")
                    and self._time() - self.start_t >= self.delay):
                self._show()
            return super().display(*args, check_delay=False, **kwargs)

        def close(self):
            super().close()
            handle, self._handle = self._handle, None
            if handle is not None:   # the stored view: the bar's last state, or nothing for a passing bar
                handle.update(self.container) if self.leave else handle.update({"text/plain": ""}, raw=True)

    return StoredNotebookBar


_BAR = _notebook_bar_class()


def progress(*args, **kwargs):
    """A tqdm progress bar (`tqdm.auto`'s arguments, ``delay`` included) whose saved notebook view
    is its last state."""
    return (_BAR or _auto_tqdm)(*args, **kwargs)


__all__ = ["progress"]
