#!/usr/bin/env bash
# End-to-end test of the live dashboard (docs/guide/dashboard.md): trains apps/examples/fashion_mlp_async.toml
# with --dashboard, loads the page in headless Chromium and checks that its charts and stage
# table received data, checks the JSON endpoints against the run's metrics.jsonl, serves the
# stopped run's directory (troupe dashboard) and checks that its events and checkpoint list read
# rounded, with units and times, and checks the token rules (a non-loopback address needs
# --dashboard-token; requests must then carry it).
# Usage: dashboard_test.sh BUILD_DIR. Env: CHROMIUM (default: chromium), DASHBOARD_SCREENSHOT
# (copy the page's screenshot there). Exits 77 (skipped) when Chromium is not installed.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: dashboard_test.sh BUILD_DIR" >&2; exit 2; }
troupe="$(cd "$1" && pwd)/apps/troupe"
source="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chromium="${CHROMIUM:-chromium}"
scratch="$(mktemp -d)"
pids=()

say() { echo "dashboard_test.sh: $*"; }
fail() {
  echo "dashboard_test.sh: FAIL: $*" >&2
  for log in "$scratch"/*.log; do
    [ -s "$log" ] && { echo "--- last lines of $(basename "$log"):" >&2; tail -n 15 "$log" >&2; }
  done
  exit 1
}
# Sends TERM to a run and waits (at most 60 s) until it has exited.
stop_run() {
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid" 2>/dev/null || true; }
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && stop_run "$pid"; done
  rm -rf "$scratch"
}
trap cleanup EXIT

[ -x "$troupe" ] || fail "$troupe is not an executable"
command -v "$chromium" >/dev/null || { say "skipped: no $chromium"; exit 77; }
command -v python3 >/dev/null || fail "python3 is needed"

# The JSON and DOM checks, in Python: `check.py COMMAND ARGS...` exits nonzero with a message.
cat >"$scratch/check.py" <<'PYTHON'
import json, os, re, socket, sys, time, urllib.error, urllib.request
from html.parser import HTMLParser

def die(message):
    sys.exit("dashboard_test.sh: FAIL: " + message)

def get(base, path, headers=None):
    """(status, body) of GET base+path; status 0 when nothing answers."""
    request = urllib.request.Request(base + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (OSError, ValueError):
        return 0, b""

def get_json(base, path):
    status, body = get(base, path)
    if status != 200:
        die(f"GET {path} answered {status or 'nothing'}")
    try:
        return json.loads(body)
    except ValueError:
        die(f"GET {path} is not JSON: {body[:200]!r}")

def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def wait_ready(base, pid, timeout_s, min_records, query=""):
    """Until the summary answers, metrics holds min_records records and a stage has worked."""
    deadline, why = time.monotonic() + timeout_s, "nothing answered"
    while time.monotonic() < deadline:
        if not alive(pid):
            die(f"the run exited before its dashboard was ready ({why})")
        status, _ = get(base, "/api/summary" + query)
        if status == 200:
            metrics = json.loads(get(base, "/api/metrics?since=0" + query.replace("?", "&"))[1] or "{}")
            records = [r for r in metrics.get("records", []) if "event" not in r]
            stages = json.loads(get(base, "/api/stages" + query)[1] or "{}").get("stages", [])
            working = [s for s in stages if (s.get("utilization") or 0) > 0]
            why = f"{len(records)} metrics records, {len(working)} stages with utilization"
            if len(records) >= min_records and working:
                return why
        elif status:
            why = f"/api/summary answered {status}"
        time.sleep(0.2)
    die(f"the dashboard was not ready after {timeout_s} s: {why}")

def file_records(run_dir):
    """The complete lines of metrics.jsonl, parsed."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        text = f.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]

def check_api(base, run_dir, stage_actors):
    first = get_json(base, "/api/metrics?since=0")
    if not isinstance(first.get("records"), list) or first.get("next") != len(first["records"]):
        die(f"/api/metrics?since=0: next {first.get('next')} is not the number of records")
    records = first["records"]
    lines = file_records(run_dir)
    common = min(len(records), len(lines))
    if common < 3:
        die(f"only {len(records)} records from /api/metrics, {len(lines)} lines in metrics.jsonl")
    for i in range(common):
        if records[i] != lines[i]:
            die(f"/api/metrics record {i} differs from metrics.jsonl line {i + 1}:\n"
                f"  {json.dumps(records[i])}\n  {json.dumps(lines[i])}")
    print(f"  /api/metrics?since=0: {len(records)} records, the first {common} equal to "
          f"metrics.jsonl's lines ({len(lines)} lines)")

    k = len(records) // 2
    part = get_json(base, f"/api/metrics?since={k}")
    again = get_json(base, "/api/metrics?since=0")["records"]
    n = len(part.get("records", []))
    if part.get("next") != k + n:
        die(f"/api/metrics?since={k}: next {part.get('next')} with {n} records, not {k + n}")
    if n < len(records) - k or part["records"] != again[k:k + n]:
        die(f"/api/metrics?since={k} is not the records from {k} on")
    rest = get_json(base, f"/api/metrics?since={part['next']}")
    if rest.get("records") != again[part["next"]:part["next"] + len(rest.get("records", []))]:
        die(f"/api/metrics?since={part['next']} is not the records from {part['next']} on")
    print(f"  /api/metrics?since={k}: exactly records {k}..{k + n - 1}")

    before = get_json(base, "/api/metrics?since=0")["records"]
    summary = get_json(base, "/api/summary")
    logged = [r["step"] for r in before if "event" not in r and "step" in r]
    step, total = summary.get("step"), summary.get("total_steps")
    if summary.get("state") not in ("running", "finished"):
        die(f"/api/summary: state {summary.get('state')!r}, not running or finished")
    if "fashion_mlp" not in str(summary.get("job")) or summary.get("mode") != "async" \
            or summary.get("stages") != 2 or summary.get("epochs") != 3:
        die(f"/api/summary: job/mode/stages/epochs are {summary.get('job')!r} "
            f"{summary.get('mode')!r} {summary.get('stages')!r} {summary.get('epochs')!r}")
    if not isinstance(step, int) or not isinstance(total, int) or not logged \
            or not max(logged) <= step <= total:
        die(f"/api/summary: step {step} is not between the latest logged step "
            f"{max(logged) if logged else None} and total_steps {total}")
    latest = summary.get("latest")
    if isinstance(latest, dict) and "step" in latest and not latest["step"] <= step:
        die(f"/api/summary: latest record's step {latest['step']} is after step {step}")
    if summary.get("stall") is not None:
        die(f"/api/summary: stall report in a healthy run: {json.dumps(summary['stall'])[:300]}")
    workers = summary.get("workers")
    if not isinstance(workers, list) or not workers or \
            not all({"name", "host", "pid"} <= set(w) for w in workers):
        die(f"/api/summary: workers {workers!r}")
    for key in ("checkpoints", ):
        if not isinstance(summary.get(key), list):
            die(f"/api/summary: {key} is not a list")
    print(f"  /api/summary: {summary['state']}, step {step} of {total} "
          f"(latest logged step {max(logged)}), {len(workers)} worker(s)")

    stages = get_json(base, "/api/stages")
    entries = stages.get("stages")
    if not isinstance(entries, list) or len(entries) != stage_actors:
        die(f"/api/stages: {len(entries) if isinstance(entries, list) else entries!r} "
            f"stage actors, not {stage_actors}")
    if sorted(e.get("stage") for e in entries) != list(range(stage_actors)):
        die(f"/api/stages: stages {[e.get('stage') for e in entries]}")
    for e in entries:
        for key in ("utilization", "idle"):
            if not isinstance(e.get(key), (int, float)) or not 0 <= e[key] <= 1.000001:
                die(f"/api/stages: actor {e.get('actor')}'s {key} is {e.get(key)!r}")
        for key in ("keys_held", "keys_waiting", "staleness_histogram"):
            if not isinstance(e.get(key), list):
                die(f"/api/stages: actor {e.get('actor')}'s {key} is {e.get(key)!r}")
    print(f"  /api/stages: {len(entries)} stage actors, utilization "
          + ", ".join(f"{e['utilization']:.2f}" for e in entries))

    trace = get_json(base, "/api/trace?since=0")
    spans = trace.get("spans")
    if not isinstance(spans, list) or not any(isinstance(s, list) and len(s) == 5 and s[0] >= 0
                                              for s in spans):
        die(f"/api/trace: no stage spans ({str(spans)[:200]})")
    since = trace["now_s"] - 1
    later = get_json(base, f"/api/trace?since={since}").get("spans", [])
    if any(s[3] + s[4] <= since - 1e-6 for s in later):
        die(f"/api/trace?since={since}: a span that ended before {since}")
    print(f"  /api/trace: {len(spans)} spans, {len(later)} ended in the last second")

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.canvases, self.stage_rows = {}, []
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "canvas":
            self.canvases[attrs.get("id")] = attrs.get("data-points")
        if tag == "tr" and "stage-row" in (attrs.get("class") or "").split():
            self.stage_rows.append(attrs.get("data-actor"))

def check_dom(dom_file, stage_actors, charts):
    dom = Dom()
    with open(dom_file, errors="replace") as f:
        dom.feed(f.read())
    for chart in charts.split(","):
        value = dom.canvases.get(chart)
        if value is None or not value.isdigit() or int(value) <= 0:
            die(f"the page's <canvas id={chart}> has data-points {value!r} (want > 0); "
                f"all: {dom.canvases}")
    if len(set(dom.stage_rows)) != stage_actors or len(dom.stage_rows) != stage_actors:
        die(f"the stage table has rows for actors {dom.stage_rows}, want {stage_actors}")
    print("  page: data-points " + ", ".join(f"{k} {v}" for k, v in dom.canvases.items())
          + f"; stage rows for actors {', '.join(dom.stage_rows)}")

def check_png(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        die(f"{path} is not a PNG")
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if width == 0 or height == 0:
        die(f"{path} is {width}x{height}")
    print(f"  screenshot: PNG {width}x{height}, {os.path.getsize(path)} bytes")

def check_token(base, token):
    def status(path, headers=None):
        return get(base, path, headers)[0]
    for path in ("/api/summary", "/api/metrics?since=0", "/api/stages"):
        without = status(path)
        wrong = status(path + ("&" if "?" in path else "?") + "token=wrong" + token)
        with_query = status(path + ("&" if "?" in path else "?") + "token=" + token)
        with_header = status(path, {"Authorization": "Bearer " + token})
        if without not in (401, 403) or wrong not in (401, 403):
            die(f"GET {path} without the token answered {without}, with a wrong one {wrong}")
        if with_query != 200 or with_header != 200:
            die(f"GET {path} with the token answered {with_query} (query), {with_header} (header)")
    print(f"  token: /api/* without it or with a wrong one 401/403; with ?token= or "
          f"Authorization: Bearer 200 ({status('/')} for /, "
          f"{status('/?token=' + token)} for /?token=)")

class Items(HTMLParser):
    """The text of every <li> of the event and checkpoint lists, with its data-event."""
    def __init__(self):
        super().__init__()
        self.items, self.current = [], None
    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "li" and attrs.get("class") in ("event", "checkpoint"):
            self.current = [attrs["class"], attrs.get("data-event"), ""]
    def handle_data(self, data):
        if self.current is not None:
            self.current[2] += data
    def handle_endtag(self, tag):
        if tag == "li" and self.current is not None:
            self.items.append((self.current[0], self.current[1], " ".join(self.current[2].split())))
            self.current = None

def duration(s):
    """The page's duration(): a tenth of a second below a minute."""
    if s < 60:
        return f"{s:.1f} s"
    m = int(s // 60)
    return f"{m} min {int(s % 60)} s" if m < 60 else f"{m // 60} h {m % 60} min"

def check_events(dom_file, run_dir):
    parser = Items()
    with open(dom_file, errors="replace") as f:
        parser.feed(f.read())
    events = [(kind, text) for cls, kind, text in parser.items if cls == "event"]
    listed = [text for cls, _, text in parser.items if cls == "checkpoint"]
    written = [r for r in file_records(run_dir) if r.get("event") == "checkpoint"]
    if not written:
        die("the run wrote no checkpoint event to metrics.jsonl")
    for kind, text in events:
        if re.search(r"\d\.\d{4,}", text) or "…" in text:
            die(f"event {kind!r} reads {text!r}: a raw number or an unread field")
    shown = [text for kind, text in events if kind == "checkpoint"]
    if not shown:
        die(f"no checkpoint among the page's events: {events}")
    # checkpoint at step 940 (21.3 s) — epoch 1, 4.21 MB, took 147 ms, /tmp/x/checkpoints/step-940
    took = r"(\d+(\.\d+)? ms|\d+\.\d\d s)"
    pattern = (r"checkpoint at step [\d,]+ \((\d+\.\d s|\d+ min \d+ s)\) — epoch \d+, "
               r"\d+(\.\d+)? (kB|MB|GB), took " + took + r", \S+/step-\d+")
    for text in shown:
        if not re.fullmatch(pattern, text):
            die(f"the checkpoint event reads {text!r}")
    if len(listed) != min(len(written), 10):
        die(f"the checkpoint list has {len(listed)} entries, metrics.jsonl {len(written)}: {listed}")
    for text, event in zip(listed, reversed(written[-10:])):
        want = (f"step {event['step']:,} at {duration(event['wall_s'])}, ")
        if not text.startswith(want) or not text.endswith(event["directory"]) \
                or not re.search(r", \d+(\.\d+)? (kB|MB|GB) in " + took + " — ", text):
            die(f"the checkpoint list reads {text!r}, want {want}… in … s — {event['directory']}")
    print(f"  events: {len(events)} lines, none with a raw number; the checkpoint event reads "
          f"\"{shown[0]}\"; the checkpoint list \"{listed[0]}\"")

command, args = sys.argv[1], sys.argv[2:]
if command == "port":
    print(free_port())
elif command == "wait":
    query = f"?token={args[4]}" if len(args) > 4 else ""
    print("  ready: " + wait_ready(args[0], int(args[1]), float(args[2]), int(args[3]), query))
elif command == "api":
    check_api(args[0], args[1], int(args[2]))
elif command == "dom":
    check_dom(args[0], int(args[1]), args[2])
elif command == "up":
    deadline = time.monotonic() + float(args[1])
    while get(args[0], "/api/summary")[0] != 200:
        if time.monotonic() > deadline:
            die(f"{args[0]}/api/summary did not answer within {args[1]} s")
        time.sleep(0.2)
elif command == "events":
    check_events(args[0], args[1])
elif command == "png":
    check_png(args[0])
elif command == "token":
    check_token(args[0], args[1])
else:
    die("unknown check " + command)
PYTHON
check() { python3 "$scratch/check.py" "$@" || fail "check $1 (see above)"; }

# Loads URL in headless Chromium for a few seconds of page time (fetches pause that clock),
# writes the DOM to $scratch/dom-NAME.html and a screenshot to $scratch/page-NAME.png.
load_page() {
  local url="$1" name="$2"
  rm -f "$scratch/page-$name.png"
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$scratch/chromium-$name" --no-first-run --virtual-time-budget=4000 \
    --window-size=1400,1600 --screenshot="$scratch/page-$name.png" --dump-dom "$url" \
    >"$scratch/dom-$name.html" 2>"$scratch/chromium-$name.err" ||
    fail "chromium could not load $url (status $?): $(tail -n 3 "$scratch/chromium-$name.err")"
  if [ ! -f "$scratch/page-$name.png" ]; then  # in case this Chromium does one thing per call
    timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
      --user-data-dir="$scratch/chromium-$name" --virtual-time-budget=4000 \
      --window-size=1400,1600 --screenshot="$scratch/page-$name.png" "$url" \
      >/dev/null 2>>"$scratch/chromium-$name.err" || fail "chromium took no screenshot of $url"
  fi
}

cd "$source"
job=(apps/examples/fashion_mlp_async.toml --set training.epochs=3 --set metrics.log_interval=20
     --set parallelism.stages=2 --set metrics.stall_timeout_s=30 --set checkpoint.interval_steps=1000)

# 1. A run with the dashboard on loopback: about 30 s on 2 cores, a metrics line every 20 steps.
port="$(check port)"
base="http://127.0.0.1:$port"
"$troupe" train "${job[@]}" --dashboard "127.0.0.1:$port" --out "$scratch/run" --quiet \
  >"$scratch/run.log" 2>&1 &
run_pid=$!
pids+=("$run_pid")
say "run $run_pid with --dashboard 127.0.0.1:$port"
check wait "$base" "$run_pid" 30 3

load_page "$base/" live
kill -0 "$run_pid" 2>/dev/null || say "warning: the run ended while the page loaded"
check dom "$scratch/dom-live.html" 2 chart-loss,chart-throughput,chart-utilization,chart-gantt
check png "$scratch/page-live.png"
if [ -n "${DASHBOARD_SCREENSHOT:-}" ]; then
  cp "$scratch/page-live.png" "$DASHBOARD_SCREENSHOT"
  say "screenshot copied to $DASHBOARD_SCREENSHOT"
fi
check api "$base" "$scratch/run" 2

# SIGUSR2 asks for a status report: a metrics.jsonl event and a log line naming every stage.
kill -0 "$run_pid" 2>/dev/null || fail "the run ended before SIGUSR2 could be checked"
kill -USR2 "$run_pid"
for _ in $(seq 100); do
  grep -q '"event":"status"' "$scratch/run/metrics.jsonl" && grep -q "stage 1 (this process)" "$scratch/run.log" && break
  sleep 0.1
done
grep -q '"event":"status"' "$scratch/run/metrics.jsonl" || fail "no status event in metrics.jsonl 10 s after SIGUSR2"
grep -q "^troupe: status at" "$scratch/run.log" || fail "no status report on stderr after SIGUSR2"
say "SIGUSR2: $(grep -c '"event":"status"' "$scratch/run/metrics.jsonl") status event in metrics.jsonl, and on stderr: $(grep -A2 '^troupe: status at' "$scratch/run.log" | tr '\n' ' ' | cut -c1-200)"

# SIGUSR1 asks for a checkpoint (a run that finished by itself took them every 1000 steps).
if kill -0 "$run_pid" 2>/dev/null; then
  kill -USR1 "$run_pid"
  for _ in $(seq 100); do
    grep -q '"event":"checkpoint"' "$scratch/run/metrics.jsonl" && break
    sleep 0.1
  done
fi

if kill -0 "$run_pid" 2>/dev/null; then
  stop_run "$run_pid"
  say "stopped the run with TERM"
else
  wait "$run_pid" || fail "the run failed (exit status $?)"
  say "the run finished by itself"
fi

# The run directory's dashboard (troupe dashboard): its events read with rounded numbers and
# units, and each checkpoint of the list says when it was taken.
port3="$(check port)"
"$troupe" dashboard "$scratch/run" --listen "127.0.0.1:$port3" >"$scratch/directory.log" 2>&1 &
directory_pid=$!
pids+=("$directory_pid")
check up "http://127.0.0.1:$port3" 30
load_page "http://127.0.0.1:$port3/" directory
check events "$scratch/dom-directory.html" "$scratch/run"
stop_run "$directory_pid"

# 2. A non-loopback address without a token is refused before training starts.
port2="$(check port)"
status=0
timeout 120 "$troupe" train "${job[@]}" --set training.max_steps=20 \
  --dashboard "0.0.0.0:$port2" --out "$scratch/refused" --quiet >"$scratch/refused.log" 2>&1 ||
  status=$?
[ "$status" -eq 2 ] || fail "--dashboard 0.0.0.0:$port2 without a token: exit status $status, not 2"
grep -q "0\.0\.0\.0" "$scratch/refused.log" ||
  fail "--dashboard 0.0.0.0:$port2 was refused without naming the address: $(cat "$scratch/refused.log")"
message="$(grep -m1 "0\.0\.0\.0" "$scratch/refused.log")"
say "  --dashboard 0.0.0.0:$port2 without --dashboard-token: exit status 2, \"$message\""

# 3. With a token: requests must carry it, and the page passes on the token of its address.
token="$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
"$troupe" train "${job[@]}" --dashboard "0.0.0.0:$port2" --dashboard-token "$token" \
  --out "$scratch/token-run" --quiet >"$scratch/token-run.log" 2>&1 &
token_pid=$!
pids+=("$token_pid")
base2="http://127.0.0.1:$port2"
check wait "$base2" "$token_pid" 30 1 "$token"
check token "$base2" "$token"
load_page "$base2/?token=$token" token
check dom "$scratch/dom-token.html" 2 chart-loss,chart-utilization
stop_run "$token_pid"

say "passed: the page's charts and stage table got data, the JSON endpoints match" \
  "metrics.jsonl, events and checkpoints read rounded with units, the token rules hold"
