"""The progress bar of ``tail`` and ``serve``: while a stream catches up many versions or
delivers a large snapshot, one line per stream on stderr with its name, the count done and
to do, the rate and the time left (tqdm draws it), and the rule for when there is one.

A bar is drawn between log lines, so it goes only with text logs: JSON logs must stay one
object per line for whatever reads them, so with ``--log-format json`` there is never a bar,
and asking for one (``--progress always``) is an error rather than a silent no. Text log
lines written while a bar is shown go through :attr:`TerminalProgress.log_stream`, which
lifts the bars, writes the line and draws them again below it.
"""

from __future__ import annotations

from typing import TextIO

from tqdm import tqdm

from deltastream.errors import InvalidArgumentError

__all__ = ["PROGRESS_MODES", "BarSafeStream", "TerminalProgress", "progress_bar"]

#: ``--progress``: ``auto`` draws a bar when stderr is a terminal, ``always`` whatever
#: stderr is, ``never`` not at all; with JSON logs, never (``always`` is refused).
PROGRESS_MODES = ("auto", "always", "never")


def progress_bar(mode: str, log_format: str, out: TextIO) -> TerminalProgress | None:
    """The bar ``--progress mode`` asks for with logs in ``log_format`` on ``out``, if any."""
    if mode not in PROGRESS_MODES:
        raise InvalidArgumentError(f"--progress must be one of {PROGRESS_MODES}, not {mode!r}")
    if mode == "never":
        return None
    if log_format != "text":
        if mode == "always":
            raise InvalidArgumentError(
                f"--progress always cannot go with {log_format} logs: a bar would break "
                "their one-object-per-line output on stderr; use --progress auto or never "
                "(with JSON logs there is no bar)"
            )
        return None
    if mode == "auto" and not out.isatty():
        return None
    return TerminalProgress(out)


class _Bar(tqdm):  # type: ignore[type-arg]  # generic only in the stubs
    """A tqdm bar without tqdm's monitor thread, which exists to redraw bars whose
    ``miniters`` grew while updates came fast and then slowed down; with ``miniters=1``
    any update redraws once ``mininterval`` passed, so the daemon needs no extra thread."""

    monitor_interval = 0


class BarSafeStream:
    """A text stream for log lines on the terminal the bars are drawn on: each write lifts
    the bars, writes and draws them again (``tqdm.write``), so lines and bars do not mix."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        tqdm.write(text, file=self.out, end="")
        return len(text)

    def flush(self) -> None:
        self.out.flush()


class TerminalProgress:
    """Called as ``progress(stream, what, done, total)`` by the streams (see
    :data:`~deltastream.daemon.stream.table_follower.Progress`); draws one bar per stream and kind
    of work (``versions``, ``files``), ``orders:  45%|####      | 45/100 versions
    [00:03<00:04, 13.2 versions/s]``, for work of at least ``minimum`` units only (short
    rounds stay quiet). A bar ends when its work is done, and a new round starts a new one."""

    def __init__(self, out: TextIO, *, minimum: int = 20) -> None:
        self.out = out
        self.minimum = minimum
        self._bars: dict[tuple[str, str], _Bar] = {}
        self.log_stream = BarSafeStream(out)

    def __call__(self, stream: str, what: str, done: int, total: int) -> None:
        key = (stream, what)
        bar = self._bars.get(key)
        if bar is not None and (bar.total != total or done < bar.n):
            self._close(key)  # a new round of work
            bar = None
        if bar is None:
            if total < self.minimum or done >= total:
                return
            bar = _Bar(
                total=total,
                desc=stream,
                unit=f" {what}",
                file=self.out,
                dynamic_ncols=True,
                mininterval=0.1,
                miniters=1,  # redraw on any update 0.1 s after the last (see _Bar)
                bar_format=(
                    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{unit} "
                    "[{elapsed}<{remaining}, {rate_fmt}]"
                ),
            )
            self._bars[key] = bar
        bar.update(done - bar.n)
        if done >= total:
            self._close(key)

    def close(self) -> None:
        """End every bar still drawn (a stream stopped before its work was done)."""
        for key in list(self._bars):
            self._close(key)

    def _close(self, key: tuple[str, str]) -> None:
        self._bars.pop(key).close()
