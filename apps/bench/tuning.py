"""Each side of a benchmark tuned as its users tune it, chosen by a short timed probe.

A PyTorch user on a CPU tries libgomp's OMP_WAIT_POLICY (PASSIVE, ACTIVE), torch.set_num_threads
(1, 2, 4, ... the cores) and OpenBLAS's own thread count (OPENBLAS_NUM_THREADS): on a small
machine PyTorch's spinning OpenMP threads and OpenBLAS's pool fight for the same cores. A troupe
user tries parallelism.threads and parallelism.spin_wait_ms (troupe runs OpenBLAS on one thread
itself, so OPENBLAS_NUM_THREADS does not reach it). probe() times every candidate for a few
seconds, each in a fresh process (the variables are read when a process starts), in rounds that
alternate their order (the machine's speed drifts), and keeps the one with the highest median
rate. The benchmark then measures against that setting and prints it beside the rate the
default settings had in the probe.

A setting is written KEY=VALUE[,KEY=VALUE...], or "default" for nothing set: an upper-case KEY is
an environment variable; `threads` is torch.set_num_threads (PyTorch) or parallelism.threads
(troupe); any other key is a troupe job key (`spin_wait_ms` stands for parallelism.spin_wait_ms).
The scripts take --probe-seconds and --probe-rounds (the probe's length), and --pytorch-setting /
--troupe-setting, which skip the probe and use the setting given.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

# The environment variables a setting owns: a candidate's process has exactly the setting's
# values of these, whatever the caller's environment holds.
CONTROLLED_VARIABLES = ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
# Steps each timed run makes before its timing starts (set-up, allocation, first-touch).
WARMUP_STEPS = 3
_ENVIRONMENT_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


# ---- settings ----------------------------------------------------------------------------------

def parse_setting(text, side):
    """The setting `text` writes, as a dict; ValueError naming the item that is not valid.
    `side` is "pytorch" or "troupe"."""
    setting = {}
    if text.strip() in ("", "default"):
        return setting
    for item in text.split(","):
        key, equals, value = item.strip().partition("=")
        if not equals or not key or not value:
            raise ValueError("'%s' is not KEY=VALUE" % item)
        if _ENVIRONMENT_NAME.match(key):
            setting[key] = value
        elif key == "threads" and side == "pytorch":
            if not value.isdigit() or int(value) < 1:
                raise ValueError("threads: expected a count of 1 or more")
            setting[key] = value
        elif side == "troupe":
            setting[key if "." in key else "parallelism." + key] = value
        else:
            raise ValueError("'%s': a PyTorch setting takes threads=N and upper-case environment "
                             "variables" % key)
    return setting


def setting_text(setting):
    """`setting` as parse_setting() reads it back."""
    return ",".join("%s=%s" % item for item in setting.items()) or "default"


def describe(setting):
    """`setting` for a reader: "OMP_WAIT_POLICY=PASSIVE, threads 2", or "default settings"."""
    parts = []
    for key, value in setting.items():
        name = key[len("parallelism."):] if key.startswith("parallelism.") else key
        parts.append("threads %s" % value if name == "threads" else "%s=%s" % (name, value))
    return ", ".join(parts) or "default settings"


def environment(setting):
    """The environment of a process that runs with `setting`: the caller's, with the controlled
    variables set as the setting says and unset where it says nothing."""
    result = {key: value for key, value in os.environ.items() if key not in CONTROLLED_VARIABLES}
    result.update({key: value for key, value in setting.items() if _ENVIRONMENT_NAME.match(key)})
    return result


def job_overrides(setting):
    """troupe's --set overrides of `setting` (its job keys)."""
    return ["%s=%s" % (key, value) for key, value in setting.items() if "." in key]


def cores():
    return len(os.sched_getaffinity(0))


def thread_counts(count):
    """1, 2, 4, ... below `count`, then `count` itself."""
    counts, threads = [], 1
    while threads < count:
        counts.append(threads)
        threads *= 2
    return counts + [count]


def pytorch_candidates(gpu=False):
    """The default (nothing set) first, then every combination a CPU user tries; on a GPU, where
    the CPU's threads only launch kernels, the wait policy and one thread or the default."""
    if gpu:
        return [{}, {"threads": "1"}, {"OMP_WAIT_POLICY": "PASSIVE"},
                {"OMP_WAIT_POLICY": "PASSIVE", "threads": "1"}]
    candidates = [{}]
    for policy in (None, "PASSIVE", "ACTIVE"):
        for threads in thread_counts(cores()):
            for blas in (None, "1"):
                candidate = {"OMP_WAIT_POLICY": policy, "threads": str(threads),
                             "OPENBLAS_NUM_THREADS": blas}
                candidates.append({k: v for k, v in candidate.items() if v is not None})
    return candidates


def troupe_candidates(stages, gpu=False):
    """parallelism.threads (thread counts that give each of `stages` stages a different share;
    on a GPU the default) by spin_wait_ms 0 and 10 (the sync and the async default)."""
    totals = [None]
    if not gpu:
        by_share = {max(1, threads // stages): threads for threads in thread_counts(cores())}
        totals = sorted(by_share.values())
    candidates = []
    for threads in totals:
        for spin in ("0", "10"):
            candidate = {"parallelism.spin_wait_ms": spin}
            if threads is not None:
                candidate = {"parallelism.threads": str(threads), **candidate}
            candidates.append(candidate)
    return candidates


# ---- the probe ---------------------------------------------------------------------------------

class Choice:
    """The setting a side runs with, and what the probe measured (nothing when it was given)."""

    def __init__(self, setting, measured=None, probed=None):
        self.setting = setting
        self.measured = measured or []  # [(setting, [rates])]
        # Whether a probe chose it (a process started again with the probe's choice knows it
        # without the probe's rates).
        self.probed = bool(self.measured) if probed is None else probed

    def rate_of(self, setting):
        """The median rate `setting` had in the probe, or None."""
        for candidate, rates in self.measured:
            if candidate == setting:
                return statistics.median(rates)
        return None

    def label(self):
        return "%s: %s" % ("tuned" if self.probed else "given", describe(self.setting))


def probe(name, candidates, measure, rounds, unit):
    """Times each of `candidates` with measure(setting) -> rate, `rounds` times in alternating
    order, prints every median and returns the Choice of the fastest."""
    print("%s: probing %d settings in %d alternating rounds" % (name, len(candidates), rounds),
          flush=True)
    rates = [[] for _ in candidates]
    for round_index in range(rounds):
        order = range(len(candidates))
        for index in order if round_index % 2 == 0 else reversed(order):
            rates[index].append(measure(candidates[index]))
    medians = [statistics.median(values) for values in rates]
    best = max(range(len(candidates)), key=lambda index: medians[index])
    for index, candidate in enumerate(candidates):
        print("  probe %-60s %10.1f %s%s" % (describe(candidate), medians[index], unit,
                                              "  <- chosen" if index == best else ""), flush=True)
    return Choice(candidates[best], list(zip(candidates, rates)))


def chosen(given, name, candidates, measure, args, unit):
    """The Choice for one side: `given` (a parsed --*-setting) when there is one, else a probe."""
    if given is not None:
        print("%s: %s (given, not probed)" % (name, describe(given)), flush=True)
        return Choice(given)
    return probe(name, candidates, measure, args.probe_rounds, unit)


def summary_line(name, choice, rate, unit, default_rate=None, chosen_rate=None):
    """"pytorch (tuned: OMP_WAIT_POLICY=PASSIVE, threads 2): 8549 samples/s; in the probe
    8120 samples/s, default settings 2498 (0.31x)": `rate` is the tuned side's measured rate; the
    default is compared with the chosen setting's own probe rate, like with like."""
    if default_rate is None:
        default_rate = choice.rate_of({})
    text = "%s (%s): %.1f %s; " % (name, choice.label(), rate, unit)
    if default_rate is None:
        return text + "default settings not probed"
    if chosen_rate is None:
        chosen_rate = choice.rate_of(choice.setting)
    if chosen_rate is None:
        return text + "default settings %.1f %s in the probe" % (default_rate, unit)
    return text + "in the probe %.1f %s, default settings %.1f (%.2fx)" % (
        chosen_rate, unit, default_rate, default_rate / chosen_rate)


def timed_rate(step, seconds=None, steps=None, warmup=WARMUP_STEPS):
    """Calls step() `warmup` times, then `steps` times (or for `seconds`, at least twice), and
    returns the timed calls per second."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    count = 0
    while True:
        step()
        count += 1
        elapsed = time.perf_counter() - start
        if (count >= steps) if steps is not None else (elapsed >= seconds and count >= 2):
            return count / elapsed


def child_result(command, setting, what):
    """The JSON of the last line `command` prints, run with `setting`'s environment; exits naming
    `what` and showing its stderr when it fails."""
    result = subprocess.run(command, env=environment(setting), capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("%s failed (%d) with %s:\n%s" % (what, result.returncode, describe(setting),
                                                   result.stderr))
    return json.loads(result.stdout.splitlines()[-1])


def enter_pytorch(setting, torch):
    """Makes this process run with `setting`: starts it again with the setting's environment
    where its own differs (libgomp and OpenBLAS read theirs at start), then sets the threads."""
    wanted = environment(setting)
    keys = set(CONTROLLED_VARIABLES) | {key for key in setting if _ENVIRONMENT_NAME.match(key)}
    if any(os.environ.get(key) != wanted.get(key) for key in keys):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, wanted)
    if "threads" in setting:
        torch.set_num_threads(int(setting["threads"]))


def restart_with(choice):
    """Runs this command again with the probe's choice given, and the chosen and default settings'
    probed rates for its report; does not return."""
    arguments = sys.argv + ["--pytorch-setting", setting_text(choice.setting)]
    for flag, rate in (("--default-rate", choice.rate_of({})),
                       ("--chosen-rate", choice.rate_of(choice.setting))):
        if rate is not None:
            arguments += [flag, repr(rate)]
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + arguments, environment(choice.setting))


# ---- troupe's side -----------------------------------------------------------------------------

def troupe_rate(troupe, job, overrides, steps, out, per_step, warmup=WARMUP_STEPS, env=None):
    """`per_step` × troupe's steps per second over the `steps` steps after its first `warmup`,
    from its per-step metrics records (log_interval 1), so that no one-off cost of the first
    steps counts; exits naming the run when it fails or logs too few steps."""
    command = [troupe, "train", job, "--quiet", "--out", out]
    for override in overrides + [
            "training.max_steps=%d" % (warmup + steps), "checkpoint.interval_steps=0",
            "checkpoint.interval_s=0", "metrics.log_interval=1", "metrics.progress=false"]:
        command += ["--set", override]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(command), result.returncode,
                                          result.stdout + result.stderr))
    wall = {}
    with open(os.path.join(out, "metrics.jsonl")) as file:
        for line in file:
            record = json.loads(line)
            # Step records only: an evaluation's record also carries test_loss.
            if "wall_s" in record and "step" in record and "test_loss" not in record \
                    and "event" not in record:
                wall[record["step"]] = record["wall_s"]
    first = min((step for step in wall if step >= warmup), default=None)
    last = max(wall, default=None)
    if first is None or last <= first:
        sys.exit("troupe's run in %s logged too few steps (%s) to time %d after %d warm-up steps"
                 % (out, sorted(wall), steps, warmup))
    return (last - first) * per_step / (wall[last] - wall[first])


def troupe_choice(args, name, troupe, job, overrides, stages, out, per_step, unit, gpu=False):
    """troupe's Choice for one configuration (`overrides`): --troupe-setting, or a probe whose
    runs each time about --probe-seconds of steps, sized by a first short run."""
    if args.troupe_setting is not None:
        return chosen(args.troupe_setting, name, [], None, args, unit)
    candidates = troupe_candidates(stages, gpu)

    def run(setting, steps):
        return troupe_rate(troupe, job, overrides + job_overrides(setting), steps, out, per_step,
                           env=environment(setting))

    steps_per_s = run(candidates[0], 3) / per_step
    steps = max(3, int(args.probe_seconds * steps_per_s))
    return chosen(None, name, candidates, lambda setting: run(setting, steps), args, unit)


def add_arguments(parser, troupe=True, probe_seconds=3.0, probe_rounds=2):
    """The probe's flags: --probe-seconds, --probe-rounds, --pytorch-setting and, with `troupe`,
    --troupe-setting; and two that the scripts pass to their own child processes."""
    parser.add_argument("--probe-seconds", type=positive(float), default=probe_seconds,
                        help="timed seconds of each candidate setting in the probe")
    parser.add_argument("--probe-rounds", type=positive(int), default=probe_rounds,
                        help="rounds of the probe, each over every candidate")
    parser.add_argument("--pytorch-setting", type=setting_type("pytorch"), default=None,
                        help="skip PyTorch's probe and use this setting: KEY=VALUE,... "
                             "(OMP_WAIT_POLICY=PASSIVE,threads=2) or 'default'")
    if troupe:
        parser.add_argument("--troupe-setting", type=setting_type("troupe"), default=None,
                            help="skip troupe's probe and use this setting for every "
                                 "configuration: threads=N,spin_wait_ms=MS or 'default'")
    # A child process that is one candidate of a probe: time this many seconds, print the rate.
    parser.add_argument("--probe-child", type=float, default=None, help=argparse.SUPPRESS)
    # The default and the chosen settings' rates in the probe that chose --pytorch-setting.
    parser.add_argument("--default-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chosen-rate", type=float, default=None, help=argparse.SUPPRESS)


def setting_type(side):
    def parse(text):
        try:
            return parse_setting(text, side)
        except ValueError as error:
            raise argparse.ArgumentTypeError("%s setting %s: %s" % (side, text, error))
    return parse


def positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError("%s: expected a number above 0" % text)
        return value
    return parse
