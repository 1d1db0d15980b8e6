"""`phasescope record`: write telemetry to a crash-safe Parquet recording with a manifest."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import click

from phasescope.cli._options import Duration, duration_option, interval_option, live_interval
from phasescope.cli.run import CommandNotFound, _tty_foreground
from phasescope.errors import InputError, SourceError
from phasescope.identity import host_name
from phasescope.schema import PAPER_SIGNALS, TickBatch
from phasescope.sources.open import SPEC_HELP, open_source
from phasescope.sources.sampler import Sampler, until_played_out
from phasescope.store.recording import RecordingWriter, finalize, manifest_path_for, partial_dir_for

PROGRESS_EVERY_S = 0.25


class RecordingWriteError(InputError):
    """The recording could not be written (disk full): what was written stays in FILE.partial/."""


def default_output(now: float | None = None) -> Path:
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in host_name()) or "host"
    return Path(f"phasescope-{host}-{stamp}.parquet")


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _Progress:
    """What the recorder says on stderr: warnings always; unless `verbose` is off (--quiet), the start line
    and, on a terminal only (not logs, pipes, tests), one self-rewriting progress line."""

    def __init__(self, writer: RecordingWriter, verbose: bool) -> None:
        self.writer = writer
        self.verbose = verbose
        self.enabled = verbose and sys.stderr.isatty()
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < PROGRESS_EVERY_S):
            return
        self._last = now
        w = self.writer
        missing = ",".join(w.missing_signals()) or "none"
        line = (
            f"recording {_clock(now - self.started)}  {w.ticks} ticks  {w.rows} samples  "
            f"{len(w.devices)} devices  {_size(w.bytes_on_disk())}  missing: {missing}"
        )
        sys.stderr.write("\r" + line + "\x1b[K")
        sys.stderr.flush()

    def say(self, line: str) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
        click.echo(f"phasescope: {line}", err=True)

    def info(self, line: str) -> None:
        """A line that only says what is going on: --quiet leaves it out."""
        if self.verbose:
            self.say(line)

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _summary(manifest: dict[str, Any], path: Path) -> str:
    size = path.stat().st_size if path.exists() else 0
    missing = ", ".join(s for s in manifest.get("missing_signals", []) if s in PAPER_SIGNALS) or "none"
    return (
        f"recorded {manifest['rows']} samples of {len(manifest['devices'])} device(s) over "
        f"{manifest['duration_s']:.1f} s to {path} ({_size(size)}); manifest {manifest_path_for(path).name}; "
        f"classifier signals never seen: {missing}"
    )


@click.command("record", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Parquet file to write [default: phasescope-<host>-<utc time>.parquet here].",
)
@interval_option("Seconds between samples.")
@duration_option("Stop after this long, e.g. 90s or 2h [default: until Ctrl-C].")
@click.option("--source", "source_spec", default="auto", show_default=True, help=SPEC_HELP)
@click.option(
    "--segment",
    "segment_s",
    type=Duration(min=1.0, min_open=False),
    default=60.0,
    show_default=True,
    help="Span of each closed Parquet segment while recording (at least 1s).",
)
@click.option(
    "--recover",
    "recover",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Finalise the FILE.partial/ directory a crashed recorder left, then exit.",
)
@click.option("--quiet", is_flag=True,
              help="Only warnings and errors on stderr: no progress, start or summary line.")
@click.option(
    "--label-from-hooks",
    "label_from_hooks",
    is_flag=True,
    help="Run CMD with phasescope's PyTorch hooks and write its exact phases as labels.csv rows beside "
    "the recording (for `phasescope eval` / `train-model`).",
)
@click.option("--family", default="", help="The `family` column of the labels rows (the workload's name).")
@click.option("--store", "store_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also keep every sample in this SQLite live store (read by `verify --since/--until`).")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def command(
    output: Path | None,
    interval: float | None,
    duration: float | None,
    source_spec: str,
    segment_s: float,
    recover: Path | None,
    quiet: bool,
    label_from_hooks: bool,
    family: str,
    store_path: Path | None,
    cmd: tuple[str, ...],
) -> None:
    """Record telemetry to Parquet (+ FILE.manifest.json), crash-safe: a kill -9 loses at most ~1 s.

    \b
    With a CMD (after `--`), records while CMD runs and exits with its exit code.

    \b
    Examples:
      phasescope record -o run.parquet --duration 600
      phasescope record --recover run.parquet.partial
      phasescope record -o train.parquet --label-from-hooks -- python train.py
    """
    if recover is not None:
        manifest = finalize(recover)
        final = recover.with_name(recover.name[: -len(".partial")])
        if not quiet:
            click.echo(f"phasescope: {_summary(manifest, final)}", err=True)
        return
    if duration is not None and not duration > 0:
        raise click.BadParameter("expected a positive number of seconds", param_hint="--duration")
    if not segment_s > 0:
        raise click.BadParameter("expected a positive number of seconds", param_hint="--segment")
    if label_from_hooks and not cmd:
        raise click.BadParameter("expected a command to run after `--`", param_hint="--label-from-hooks")
    path = output or default_output()

    source = open_source(source_spec)
    try:
        interval = live_interval(source, interval)  # a replay: its own recorded rate (times the speed)
        store = None
        if store_path is not None:  # before the recording file: a store another process writes is refused
            from phasescope.store.live import open_for_writing

            try:
                store = open_for_writing(store_path)
            except OSError as exc:  # its folder cannot be made (a file in the way, read-only): as serve says
                raise InputError(store_path, "--store", "a store file that can be created and written",
                                 exc.strerror or str(exc)) from None
        partial_was_there = partial_dir_for(path).exists()  # then RecordingWriter refuses, in one line
        try:
            writer = RecordingWriter(path, source_spec=source_spec, interval_s=interval, segment_s=segment_s)
        except OSError as exc:  # its FILE.partial/ directory cannot be made (no such folder, read-only)
            if not partial_was_there:
                # Made, then its header could not be written (disk full): left there, the next run's
                # RecordingWriter refused it as "an existing partial recording" that --recover refused too.
                shutil.rmtree(partial_dir_for(path), ignore_errors=True)
            raise InputError(path, "--output", "a path where a new recording can be written",
                             exc.strerror or str(exc)) from None
        if not cmd:
            _record(source, Sampler(source, interval), writer, duration, not quiet, path, store=store)
            return
        code = _record_command(list(cmd), source, Sampler(source, interval), writer, duration, not quiet,
                               path, label_from_hooks, family, store)
    finally:
        source.close()
    sys.exit(code)


def _record_command(cmd: list[str], source: Any, sampler: Any, writer: RecordingWriter,
                    duration: float | None, progress_on: bool, path: Path, label_from_hooks: bool,
                    family: str, store: Any = None) -> int:
    """Record while `cmd` runs (hooks injected when labelling); then write its labels; its exit code."""
    import subprocess
    import tempfile

    from phasescope.instrument.inject import child_env

    with tempfile.TemporaryDirectory(prefix="phasescope-record-") as tmp:
        events_dir = Path(tmp)
        env = child_env(events_dir, flush_s=2.0) if label_from_hooks else None
        try:
            child = subprocess.Popen(cmd, env=env)
        except (FileNotFoundError, PermissionError) as exc:
            writer.discard()
            raise CommandNotFound(f"{cmd[0]}: {exc.strerror or 'cannot run'}") from None
        stop = threading.Event()

        def stop_when_done() -> None:
            child.wait()
            stop.set()

        threading.Thread(target=stop_when_done, name="phasescope-child", daemon=True).start()
        recorded = False
        try:
            _record(source, sampler, writer, duration, progress_on, path, stop=stop, child=child, store=store)
            recorded = True
        except RecordingWriteError as exc:
            # Said at once; CMD runs on (it is not the recorder's to stop) and its exit code stays record's.
            click.echo(f"phasescope: {exc}", err=True)
        except SourceError as exc:
            if child.poll() is None:
                raise
            # CMD ended before the first sample: say so, but exit with CMD's code, as promised.
            click.echo(f"phasescope: {exc}", err=True)
        finally:
            code = child.wait()
        if label_from_hooks and recorded:
            _write_labels(events_dir, path, writer, family, progress_on)
    return 128 - code if code < 0 else code


def _write_labels(events_dir: Path, path: Path, writer: RecordingWriter, family: str,
                  verbose: bool = True) -> None:
    from phasescope.instrument.labels import label_rows, split_unsampled, write_labels_csv
    from phasescope.store.recording import read_recording

    seen = [s for s in PAPER_SIGNALS if s not in set(writer.missing_signals())]
    rate = f"{1.0 / writer.interval_s:g}" if writer.interval_s else ""
    rows = label_rows(events_dir, path.name, writer.devices, family=family, run=path.stem, rate_hz=rate,
                      signals=";".join(seen))
    labels = path.parent / "labels.csv"
    if not rows:
        click.echo("phasescope: no labels: the command's hooks saw no PyTorch forward or step on a recorded "
                   "device", err=True)
        return
    times = {t.device.uuid: t.time for t in read_recording(path)}
    rows, dropped = split_unsampled(rows, writer.devices, times)
    if dropped:
        spans = ", ".join(f"{r['label']} {float(r['t_to']) - float(r['t_from']):.1f} s" for r in dropped)
        click.echo(f"phasescope: {len(dropped)} phase(s) left out of the labels, no sample inside ({spans}): "
                   "a shorter --interval samples them", err=True)
    if not rows:
        return
    write_labels_csv(rows, labels)
    if not verbose:
        return
    phases = ", ".join(f"{r['label']} {float(r['t_to']) - float(r['t_from']):.1f} s" for r in rows)
    click.echo(f"phasescope: {len(rows)} label row(s) ({phases}) appended to {labels}", err=True)


def _record(
    source: Any, sampler: Any, writer: RecordingWriter, duration: float | None, progress_on: bool, path: Path,
    stop: threading.Event | None = None, child: Any = None, store: Any = None,
) -> None:
    from phasescope.sources.replay_live import ReplaySource

    progress = _Progress(writer, progress_on)
    stop = stop or threading.Event()
    write_failed: list[OSError] = []
    # A replay's events only narrate it ("replaying …", "replay finished"); a live device's (a GPU lost)
    # are warnings, said even with --quiet.
    say_event = progress.info if isinstance(source, ReplaySource) else progress.say

    def on_tick(batch: TickBatch) -> None:
        nonlocal store
        for event in batch.events:
            say_event(event)
        try:
            writer.write(batch)
        except OSError as exc:  # disk full, a file size limit: stop; what is already written stays
            write_failed.append(exc)
            stop.set()
            return
        if store is not None:
            try:
                store.ingest(batch)
            except sqlite3.Error as exc:  # disk full: the recording is what was asked for, it goes on
                progress.say(f"store {store.path}: {exc}: new samples are not stored; the recording goes on")
                store = None
        progress.update()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        # Pass the signal on, except a terminal's Ctrl-C, which reached the child already.
        if child is not None and not (signum == signal.SIGINT and _tty_foreground()):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
        # A second Ctrl-C interrupts at once; the partial directory stays recoverable.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    in_main = threading.current_thread() is threading.main_thread()
    previous = {}
    if in_main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    progress.info(
        f"recording to {path} (every {sampler_interval(sampler):.3g} s; Ctrl-C to stop; "
        f"in progress: {partial_dir_for(path).name}/)"
    )
    try:
        sampler.run(until_played_out(source, on_tick, stop), duration=duration, stop=stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        progress.update(force=True)
        progress.done()
        writer.note_errors(source.error_counts())
        if writer.ticks == 0 and not write_failed:
            writer.discard()
            raise SourceError("nothing recorded: stopped before the first sample")
        if not write_failed:
            try:
                manifest = writer.close()
            except OSError as exc:
                write_failed.append(exc)
    if write_failed:
        partial = partial_dir_for(path)
        why = os.strerror(write_failed[0].errno) if write_failed[0].errno else str(write_failed[0])
        if not _kept_samples(partial):
            # Nothing reached the disk (the first writes failed): --recover would refuse the folder, and a
            # new run would refuse to start beside it, so it goes, and the line does not promise a recovery.
            with contextlib.suppress(OSError):
                writer.discard()
            shutil.rmtree(partial, ignore_errors=True)
            raise RecordingWriteError(path, "writing the recording", "room to write (no sample reached the "
                                      "disk: nothing is kept)", why)
        raise RecordingWriteError(
            partial, "writing the recording",
            f"room to write (the samples written so far are kept: once there is room, finish them with "
            f"'phasescope record --recover {partial}')",
            why)
    progress.info(_summary(manifest, path))


def _kept_samples(partial: Path) -> bool:
    """Whether a complete sample batch of this partial recording is on disk (what --recover needs). Stops
    at the first one found: cheap however long the recording ran."""
    from phasescope.store.recording import SAMPLE_SCHEMA, _iter_segments

    try:
        return any(table.num_rows for table, _ in _iter_segments(partial, "seg", SAMPLE_SCHEMA))
    except Exception:  # unreadable here: keep the folder, and let --recover say what it finds
        return True


def sampler_interval(sampler: Any) -> float:
    return float(getattr(sampler, "interval_s", getattr(sampler, "interval", 0.0)) or 0.0)
