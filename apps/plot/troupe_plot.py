#!/usr/bin/env python3
"""Figures of one or several troupe runs overlaid, as PNG and SVG.

Run by `troupe plot RUN_DIR [RUN_DIR...] --out DIR` (see README.md, "Plots"); it can also be run
directly. Reads each run directory's metrics.jsonl (required), summary.json, config.json and
trace.json (optional), writes loss, accuracy, throughput, Gantt and staleness figures to DIR and
prints the path of every file it wrote. Exit status: 0 when the figures were written, 2 on bad
input (naming the directory or file), 1 when python3-matplotlib is missing.
"""

import argparse
import json
import math
import os
import sys

# Fields of a metrics record that must be numbers (or null, which a NaN or infinity becomes).
NUMBER_FIELDS = ("step", "epoch", "loss", "lr", "samples_per_s", "wall_s", "test_accuracy",
                 "test_loss", "tokens_per_s", "validation_loss", "bits_per_byte")
DEFAULT_GANTT_SECONDS = 2.0
STALENESS_LEGEND_INCHES = 2.2  # room right of the staleness histograms for the runs' legend
SPAN_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "backward+step": "#d62728",
               "step": "#2ca02c", "optimizer_step": "#2ca02c", "scheduled+step": "#2ca02c",
               "reduce": "#a0522d", "reduce+step": "#a0522d", "idle": "#e6e6e6"}
OTHER_SPAN_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


class PlotError(Exception):
    """Bad input: the message names the directory, file or option at fault."""


class Run:
    """One run directory's files, as read."""

    def __init__(self, directory, label):
        self.directory = directory
        self.label = label
        self.records = []  # metrics records (dicts without "event"), in file order
        self.events = []  # (event dict, the metrics record before it or None)
        self.summary = None
        self.config = None
        self.stages = {}  # stage -> staleness histogram, summed over replicas (summary.json)
        self.trace_path = None  # read only for the run the Gantt chart shows
        self.notes = []


def note(message):
    print("troupe plot: note: " + message, file=sys.stderr)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="troupe plot",
        description="Write PNG and SVG figures of one or several troupe runs overlaid.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a troupe run directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory of the figures")
    parser.add_argument("--label", action="append", default=[],
                        help="legend label of a run (give it once per run, in order)")
    parser.add_argument("--window", metavar="START:END",
                        help="seconds from the start of the trace that the Gantt chart shows "
                        "(default: the last %g s of training work of the first run with a "
                        "trace.json)" % DEFAULT_GANTT_SECONDS)
    return parser.parse_args(argv)


def parse_window(text):
    """(start, end) in seconds from "START:END"; None for an empty side."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 2:
        raise PlotError("--window %r is not START:END (seconds)" % text)
    try:
        start = float(parts[0]) if parts[0].strip() else None
        end = float(parts[1]) if parts[1].strip() else None
    except ValueError:
        raise PlotError("--window %r is not START:END (seconds)" % text) from None
    if any(v is not None and not math.isfinite(v) for v in (start, end)) or (
            start is not None and end is not None and end <= start):
        raise PlotError("--window %r: START and END must be finite and START < END" % text)
    return start, end


def default_labels(directories):
    """The directory names; where two runs share a name, their parent directories' too."""
    paths = [os.path.abspath(d) for d in directories]
    names = [os.path.basename(p) for p in paths]
    for i, name in enumerate(names):
        if names.count(name) > 1:
            names[i] = os.path.join(os.path.basename(os.path.dirname(paths[i])), name)
    return names


def read_json_file(path):
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, UnicodeDecodeError) as error:
        raise PlotError("cannot read %s: %s" % (path, error)) from None
    except json.JSONDecodeError as error:
        raise PlotError("%s is not valid JSON: %s" % (path, error)) from None


def check_record(record, path, number):
    for field in NUMBER_FIELDS:
        value = record.get(field)
        if value is not None and (isinstance(value, bool) or
                                  not isinstance(value, (int, float))):
            raise PlotError("%s line %d: \"%s\" is not a number" % (path, number, field))
    for field in ("step", "wall_s"):
        if record.get(field) is None:
            raise PlotError("%s line %d: a metrics record without \"%s\"" % (path, number, field))


def read_metrics(run):
    path = os.path.join(run.directory, "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise PlotError("cannot read %s: %s" % (path, error)) from None
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # no newline after it: a line still being written
                run.notes.append("%s: its unfinished last line is left out" % path)
                break
            raise PlotError("%s line %d is not JSON: %s" % (path, number, error)) from None
        if not isinstance(record, dict):
            raise PlotError("%s line %d is not a JSON object" % (path, number))
        if "event" in record:
            run.events.append((record, run.records[-1] if run.records else None))
            continue
        check_record(record, path, number)
        run.records.append(record)


def read_run(directory, label):
    if not os.path.isdir(directory):
        raise PlotError("%s is not a directory" % directory)
    if not os.path.isfile(os.path.join(directory, "metrics.jsonl")):
        raise PlotError("%s has no metrics.jsonl: not a troupe run directory" % directory)
    run = Run(directory, label)
    read_metrics(run)
    for name in ("summary", "config"):
        path = os.path.join(directory, name + ".json")
        if os.path.isfile(path):
            value = read_json_file(path)
            if not isinstance(value, dict):
                raise PlotError("%s is not a JSON object" % path)
            setattr(run, name, value)
    run.stages = stage_histograms(run)
    trace = os.path.join(directory, "trace.json")
    run.trace_path = trace if os.path.isfile(trace) else None
    return run


def legend_label(run, given):
    """The run's label; a directory-name label also says the mode and stages from config.json."""
    parallelism = (run.config or {}).get("parallelism")
    if given or not isinstance(parallelism, dict):
        return run.label
    details = []
    if isinstance(parallelism.get("mode"), str):
        details.append(parallelism["mode"])
    if isinstance(parallelism.get("stages"), int):
        details.append("%d stages" % parallelism["stages"])
    return "%s (%s)" % (run.label, ", ".join(details)) if details else run.label


def is_evaluation(record):
    return any(record.get(f) is not None for f in ("test_accuracy", "test_loss",
                                                    "validation_loss"))


def series(run, x_field, y_field, training_only=False):
    """The run's (x, y) points. With training_only, not the evaluation lines where there are
    others: their loss is over the epoch so far and their samples/s count the evaluation."""
    records = run.records
    if training_only and any(not is_evaluation(r) for r in records):
        records = [r for r in records if not is_evaluation(r)]
    points = [(r[x_field], r[y_field]) for r in records
              if r.get(y_field) is not None and r.get(x_field) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def event_position(event, before, x_field):
    """Where an event sits on the x axis: its own step, else the record logged before it."""
    if x_field == "step" and isinstance(event.get("step"), (int, float)):
        return event["step"]
    return before.get(x_field) if before else None


class Plotter:
    """Draws the figures into one output directory."""

    def __init__(self, pyplot, runs, out, labels_given):
        self.plt = pyplot
        self.runs = runs
        self.out = out
        colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
        self.color = {id(run): colors[i % len(colors)] for i, run in enumerate(runs)}
        self.legend = {id(run): legend_label(run, labels_given) for run in runs}

    def save(self, figure, name, layout_rect=(0, 0, 1, 1)):
        figure.tight_layout(rect=layout_rect)
        for extension in ("png", "svg"):
            path = os.path.join(self.out, "%s.%s" % (name, extension))
            try:
                figure.savefig(path, dpi=120,
                               metadata={"Date": None} if extension == "svg" else None)
            except OSError as error:
                raise PlotError("cannot write %s: %s" % (path, error)) from None
            print(path, flush=True)
        self.plt.close(figure)

    def missing(self, field):
        return [run.label for run in self.runs
                if not any(r.get(field) is not None for r in run.records)]

    def mark_events(self, axes, run, x_field):
        kinds = set()
        for event, before in run.events:
            x = event_position(event, before, x_field)
            if x is not None:
                axes.axvline(x, color=self.color[id(run)], linestyle=":", linewidth=1, alpha=0.6)
                kinds.add(str(event.get("event")))
        return kinds

    def line_figure(self, name, x_field, x_label, curves, y_label, title, mark_events=False):
        """One line per run and curve; curves are (y field, line style, suffix of the label,
        training lines only). Not drawn when no run has any of the curves."""
        lines = [(run, style, suffix, series(run, x_field, field, training_only))
                 for run in self.runs for field, style, suffix, training_only in curves]
        if not any(points[0] for _, _, _, points in lines):
            note("no run has %s: no %s figure" % (" or ".join(c[0] for c in curves), name))
            return
        figure, axes = self.plt.subplots(figsize=(8, 4.5))
        for run, style, suffix, (x, y) in lines:
            if x:
                axes.plot(x, y, style, color=self.color[id(run)], markersize=4,
                          label=self.legend[id(run)] + suffix)
        kinds = set()
        for run in self.runs if mark_events else ():
            kinds |= self.mark_events(axes, run, x_field)
        if kinds:
            axes.plot([], [], ":", color="grey", label="events: " + ", ".join(sorted(kinds)))
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
        self.save(figure, name)

    def loss(self):
        without_test = self.missing("test_loss")
        if without_test:
            note("runs with no test loss: " + ", ".join(without_test))
        curves = (("loss", "-", " training", True), ("test_loss", "o--", " test", False))
        for name, x_field, x_label in (("loss_vs_steps", "step", "step"),
                                       ("loss_vs_time", "wall_s", "wall-clock time (s)")):
            self.line_figure(name, x_field, x_label, curves, "loss", "Loss", mark_events=True)

    def accuracy(self):
        without = self.missing("test_accuracy")
        if len(without) == len(self.runs):
            note("no run has a test accuracy: no accuracy figures")
            return
        if without:
            note("runs with no test accuracy: " + ", ".join(without))
        curves = (("test_accuracy", "o-", "", False),)
        for name, x_field, x_label in (("accuracy_vs_steps", "step", "step"),
                                       ("accuracy_vs_time", "wall_s", "wall-clock time (s)")):
            self.line_figure(name, x_field, x_label, curves, "test accuracy", "Test accuracy")

    def throughput(self):
        self.line_figure("throughput", "wall_s", "wall-clock time (s)",
                         (("samples_per_s", "-", "", True),), "training samples/s", "Throughput")

    def gantt(self, window, trace):
        """trace: (run, tracks, spans) of the first run with a trace.json, or None."""
        untraced = [run.label for run in self.runs if not run.trace_path]
        if trace is None:
            note("no run has a trace.json (train with --set metrics.trace=true): no gantt figure")
            return
        if untraced:
            note("runs with no trace.json: " + ", ".join(untraced))
        run, tracks, spans = trace
        if sum(1 for r in self.runs if r.trace_path) > 1:
            note("the gantt figure shows the trace of %s only" % run.label)
        if not spans:
            note("%s has no spans: no gantt figure" % run.trace_path)
            return
        start, end = gantt_window(spans, window)
        shown = [s for s in spans if s[1] < end and s[1] + s[2] > start]
        if not shown:
            note("%s has no spans between %g and %g s: no gantt figure"
                 % (run.trace_path, start, end))
            return
        self.draw_gantt(run, tracks, shown, start, end)

    def draw_gantt(self, run, tracks, spans, start, end):
        used = sorted({s[0] for s in spans}, key=lambda tid: (tracks.get(tid, (tid, ""))[0], tid))
        row = {tid: i for i, tid in enumerate(used)}
        figure, axes = self.plt.subplots(figsize=(10, 1.2 + 0.6 * len(used)))
        order = list(SPAN_COLORS)  # forward, backward, ..., then other names, idle last
        names = sorted({s[3] for s in spans},
                       key=lambda n: (n == "idle", order.index(n) if n in order else len(order), n))
        others = iter(OTHER_SPAN_COLORS * 8)
        for name in names:
            color = SPAN_COLORS.get(name) or next(others, "#7f7f7f")
            label = name
            for tid in used:
                bars = [(max(s[1], start), min(s[1] + s[2], end) - max(s[1], start))
                        for s in spans if s[0] == tid and s[3] == name]
                if bars:
                    axes.broken_barh(bars, (row[tid] - 0.4, 0.8), facecolors=color, linewidth=0,
                                     label=label)
                    label = None  # one legend entry per span name
        axes.set_yticks(range(len(used)))
        axes.set_yticklabels([tracks.get(tid, (tid, "track %s" % tid))[1] for tid in used])
        axes.set_ylim(len(used) - 0.5, -0.5)
        axes.set_xlim(start, end)
        axes.set_xlabel("time from the start of the trace (s)")
        axes.set_title("Stage work of %s, %.2f-%.2f s" % (self.legend[id(run)], start, end))
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
        self.save(figure, "gantt")

    def staleness(self):
        histograms = {id(run): run.stages for run in self.runs if run.stages}
        without = [run.label for run in self.runs if id(run) not in histograms]
        if not histograms:
            note("no run has per-stage staleness histograms in summary.json: no staleness figure")
            return
        if without:
            note("runs with no per-stage staleness histograms: " + ", ".join(without))
        self.draw_staleness([run for run in self.runs if id(run) in histograms], histograms)

    def draw_staleness(self, runs, histograms):
        stages = sorted({s for h in histograms.values() for s in h})
        columns = min(4, len(stages))
        rows = (len(stages) + columns - 1) // columns
        width_in = 3.2 * columns + 1 + STALENESS_LEGEND_INCHES
        figure, grid = self.plt.subplots(rows, columns, figsize=(width_in, 2.8 * rows + 0.5),
                                         sharey=True, squeeze=False)
        width = 0.8 / len(runs)
        for index, stage in enumerate(stages):
            axes = grid[index // columns][index % columns]
            for position, run in enumerate(runs):
                counts = histograms[id(run)].get(stage)
                if not counts or sum(counts) == 0:
                    continue
                total = float(sum(counts))
                axes.bar([k - 0.4 + width * (position + 0.5) for k in range(len(counts))],
                         [c / total for c in counts], width, color=self.color[id(run)],
                         label=self.legend[id(run)] if index == 0 else None)
            longest = max(len(histograms[id(run)].get(stage) or []) for run in runs)
            axes.set_xlim(-0.6, max(longest, 1) - 0.4)
            axes.set_xticks(range(0, max(longest, 1), max(1, (longest + 9) // 10)))
            axes.set_title("stage %d" % stage)
            axes.set_xlabel("staleness (versions)")
        for index in range(len(stages), rows * columns):
            grid[index // columns][index % columns].axis("off")
        for axes_row in grid:
            axes_row[0].set_ylabel("share of backward passes")
        figure.legend(loc="center right", fontsize="small")
        figure.suptitle("Staleness of the backward passes")
        self.save(figure, "staleness", (0, 0, 1 - STALENESS_LEGEND_INCHES / width_in, 1))


def stage_histograms(run):
    """{stage: staleness histogram summed over its replicas} from summary.json's "stages"."""
    stages = (run.summary or {}).get("stages")
    if not isinstance(stages, list):
        return {}
    result = {}
    path = os.path.join(run.directory, "summary.json")
    for index, entry in enumerate(stages):
        counts = entry.get("staleness_histogram") if isinstance(entry, dict) else None
        if counts is None:
            continue
        if not isinstance(counts, list) or not all(
                isinstance(c, (int, float)) and not isinstance(c, bool) and c >= 0
                for c in counts):
            raise PlotError("%s: stages[%d].staleness_histogram is not a list of counts"
                            % (path, index))
        stage = entry.get("stage", index)
        if not isinstance(stage, int) or isinstance(stage, bool):
            raise PlotError("%s: stages[%d].stage is not an integer" % (path, index))
        summed = result.setdefault(stage, [])
        summed.extend([0] * (len(counts) - len(summed)))
        for k, count in enumerate(counts):
            summed[k] += count
    return result


def read_trace(path):
    """({tid: (sort index, name)}, [(tid, start_s, duration_s, name)]) from a Chrome trace,
    start_s counted from its first span."""
    trace = read_json_file(path)
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise PlotError("%s has no \"traceEvents\" list" % path)
    tracks, spans = {}, []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise PlotError("%s: traceEvents[%d] is not an object" % (path, index))
        tid = event.get("tid", 0)
        if event.get("ph") == "M" and event.get("name") in ("thread_name", "thread_sort_index"):
            args = event.get("args") or {}
            sort_index, name = tracks.get(tid, (tid, "track %s" % tid))
            if event["name"] == "thread_name":
                name = str(args.get("name", name))
            elif isinstance(args.get("sort_index"), (int, float)):
                sort_index = args["sort_index"]
            tracks[tid] = (sort_index, name)
        elif event.get("ph") == "X":
            ts, duration = event.get("ts"), event.get("dur", 0)
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (ts, duration)):
                raise PlotError("%s: traceEvents[%d] has no numeric ts and dur" % (path, index))
            spans.append((tid, ts / 1e6, duration / 1e6, str(event.get("name", "?"))))
    origin = min((s[1] for s in spans), default=0.0)
    return tracks, [(tid, start - origin, duration, name) for tid, start, duration, name in spans]


def gantt_window(spans, window):
    """(start, end) seconds from the trace's start. By default the last DEFAULT_GANTT_SECONDS of
    training work (the final evaluation would fill them otherwise); of a window given, an empty
    END is the end of the trace and an empty START DEFAULT_GANTT_SECONDS before END."""
    start, end = window if window else (None, None)
    if end is None:
        shown = spans if window else [s for s in spans if s[3] not in ("evaluate", "idle")]
        end = max(s[1] + s[2] for s in shown or spans)
    if start is None:
        start = max(0.0, end - DEFAULT_GANTT_SECONDS)
    return start, end


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        print("troupe plot needs python3-matplotlib: apt-get install python3-matplotlib",
              file=sys.stderr)
        sys.exit(1)
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable SVG
    matplotlib.rcParams["svg.hashsalt"] = "troupe"  # the same runs give the same SVG
    import matplotlib.pyplot as pyplot
    return pyplot


def plot(arguments):
    window = parse_window(arguments.window)
    if arguments.label and len(arguments.label) != len(arguments.runs):
        raise PlotError("%d --label for %d runs: give one per run, in order"
                        % (len(arguments.label), len(arguments.runs)))
    labels = arguments.label or default_labels(arguments.runs)
    runs = [read_run(d, label) for d, label in zip(arguments.runs, labels)]
    for run in runs:
        for message in run.notes:
            note(message)
    for name in ("summary.json", "config.json"):
        without = [r.label for r in runs if getattr(r, name.split(".")[0]) is None]
        if without:
            note("runs with no %s: %s" % (name, ", ".join(without)))
    traced = [run for run in runs if run.trace_path]
    trace = (traced[0],) + read_trace(traced[0].trace_path) if traced else None
    try:
        os.makedirs(arguments.out, exist_ok=True)
    except OSError as error:
        raise PlotError("cannot create %s: %s" % (arguments.out, error)) from None
    plotter = Plotter(import_pyplot(), runs, arguments.out, bool(arguments.label))
    if not any(run.records for run in runs):
        note("no run has metrics records yet: no loss, accuracy or throughput figures")
    else:
        plotter.loss()
        plotter.accuracy()
        plotter.throughput()
    plotter.gantt(window, trace)
    plotter.staleness()
    return 0


def main(argv):
    arguments = parse_arguments(argv)
    try:
        return plot(arguments)
    except PlotError as error:
        print("troupe plot: %s" % error, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
