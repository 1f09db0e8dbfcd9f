#!/usr/bin/env python3
"""apps/bench/tuning.py (each side of a benchmark tuned by a probe) and converge_race.py (each
async row's ratio to the best sync row and to one stage), without PyTorch or troupe: fake
measurements, a fake troupe that writes metrics, and a script that re-executes itself."""

import argparse
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
from contextlib import redirect_stdout
from unittest import mock

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "apps", "bench")
sys.path.insert(0, BENCH)
sys.dont_write_bytecode = True  # nothing written into the source tree

import converge_race  # noqa: E402
import tuning  # noqa: E402


class SettingTest(unittest.TestCase):
    def test_text_round_trips(self):
        text = "OMP_WAIT_POLICY=PASSIVE,threads=2,OPENBLAS_NUM_THREADS=1"
        setting = tuning.parse_setting(text, "pytorch")
        self.assertEqual(setting, {"OMP_WAIT_POLICY": "PASSIVE", "threads": "2",
                                   "OPENBLAS_NUM_THREADS": "1"})
        self.assertEqual(tuning.parse_setting(tuning.setting_text(setting), "pytorch"), setting)
        self.assertEqual(tuning.parse_setting("default", "pytorch"), {})
        self.assertEqual(tuning.setting_text({}), "default")

    def test_troupe_keys_are_job_keys(self):
        setting = tuning.parse_setting("threads=2,spin_wait_ms=0", "troupe")
        self.assertEqual(tuning.job_overrides(setting),
                         ["parallelism.threads=2", "parallelism.spin_wait_ms=0"])
        self.assertEqual(tuning.describe(setting), "threads 2, spin_wait_ms=0")

    def test_bad_settings_are_refused(self):
        for text, side in (("threads=0", "pytorch"), ("threads=two", "pytorch"),
                           ("spin_wait_ms=3", "pytorch"), ("threads", "troupe"),
                           ("=1", "troupe")):
            with self.assertRaises(ValueError, msg=text):
                tuning.parse_setting(text, side)

    def test_described_as_a_reader_writes_it(self):
        self.assertEqual(tuning.describe({"OMP_WAIT_POLICY": "PASSIVE", "threads": "2"}),
                         "OMP_WAIT_POLICY=PASSIVE, threads 2")
        self.assertEqual(tuning.describe({}), "default settings")

    def test_environment_holds_only_the_settings_controlled_variables(self):
        outside = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7", "HOME": "/home/x"}
        with mock.patch.dict(os.environ, outside, clear=True):
            self.assertEqual(tuning.environment({}), {"HOME": "/home/x"})
            self.assertEqual(tuning.environment({"OMP_WAIT_POLICY": "PASSIVE", "threads": "1"}),
                             {"HOME": "/home/x", "OMP_WAIT_POLICY": "PASSIVE"})


class CandidatesTest(unittest.TestCase):
    def test_thread_counts_double_up_to_the_cores(self):
        self.assertEqual(tuning.thread_counts(1), [1])
        self.assertEqual(tuning.thread_counts(2), [1, 2])
        self.assertEqual(tuning.thread_counts(6), [1, 2, 4, 6])
        self.assertEqual(tuning.thread_counts(16), [1, 2, 4, 8, 16])

    def test_pytorch_tries_what_its_users_try(self):
        with mock.patch.object(tuning, "cores", return_value=2):
            candidates = tuning.pytorch_candidates()
        self.assertEqual(candidates[0], {})
        self.assertEqual(len(candidates), 1 + 3 * 2 * 2)
        texts = [tuning.setting_text(c) for c in candidates]
        self.assertEqual(len(set(texts)), len(texts))
        for wanted in ("OMP_WAIT_POLICY=PASSIVE,threads=2", "OMP_WAIT_POLICY=ACTIVE,threads=1",
                       "threads=1,OPENBLAS_NUM_THREADS=1",
                       "OMP_WAIT_POLICY=PASSIVE,threads=2,OPENBLAS_NUM_THREADS=1"):
            self.assertIn(wanted, texts)
        self.assertEqual(len(tuning.pytorch_candidates(gpu=True)), 4)

    def test_troupe_tries_each_share_of_threads_once(self):
        with mock.patch.object(tuning, "cores", return_value=2):
            one_stage = tuning.troupe_candidates(1)
            four_stages = tuning.troupe_candidates(4)
        self.assertEqual([tuning.setting_text(c) for c in one_stage], [
            "parallelism.threads=1,parallelism.spin_wait_ms=0",
            "parallelism.threads=1,parallelism.spin_wait_ms=10",
            "parallelism.threads=2,parallelism.spin_wait_ms=0",
            "parallelism.threads=2,parallelism.spin_wait_ms=10"])
        # One thread per stage either way: only the whole machine is tried.
        self.assertEqual([c["parallelism.threads"] for c in four_stages], ["2", "2"])
        self.assertNotIn("parallelism.threads", tuning.troupe_candidates(4, gpu=True)[0])


class ProbeTest(unittest.TestCase):
    RATES = {"default": [2498.0, 2400.0, 2600.0],
             "OMP_WAIT_POLICY=PASSIVE,threads=2": [8549.0, 8000.0, 9000.0],
             # Fastest once, by noise; its median is below PASSIVE's.
             "threads=1": [9900.0, 3000.0, 3100.0]}

    def probe(self, rounds=3):
        calls = []

        def measure(setting):
            text = tuning.setting_text(setting)
            calls.append(text)
            return self.RATES[text][sum(1 for call in calls if call == text) - 1]

        candidates = [tuning.parse_setting(text, "pytorch") for text in self.RATES]
        with redirect_stdout(io.StringIO()) as printed:
            choice = tuning.probe("pytorch", candidates, measure, rounds, "samples/s")
        return choice, calls, printed.getvalue()

    def test_chooses_the_highest_median_in_alternating_rounds(self):
        choice, calls, printed = self.probe()
        self.assertEqual(choice.setting, {"OMP_WAIT_POLICY": "PASSIVE", "threads": "2"})
        names = list(self.RATES)
        self.assertEqual(calls, names + names[::-1] + names)
        self.assertIn("<- chosen", [line for line in printed.splitlines() if "PASSIVE" in line][0])

    def test_reports_the_choice_beside_the_default(self):
        choice, _, _ = self.probe()
        self.assertEqual(choice.rate_of({}), 2498.0)
        self.assertEqual(
            tuning.summary_line("pytorch", choice, 7000.0, "samples/s"),
            "pytorch (tuned: OMP_WAIT_POLICY=PASSIVE, threads 2): 7000.0 samples/s; "
            "in the probe 8549.0 samples/s, default settings 2498.0 (0.29x)")
        given = tuning.Choice({"threads": "2"})
        self.assertEqual(tuning.summary_line("pytorch", given, 10.0, "tokens/s"),
                         "pytorch (given: threads 2): 10.0 tokens/s; default settings not probed")

    def test_a_chosen_default_compares_probe_with_probe(self):
        # The full run's rate differs from the probe's; the default is not 1.35x of itself.
        chosen = tuning.Choice({}, measured=[({}, [1754.2]), ({"threads": "1"}, [900.0])])
        self.assertTrue(tuning.summary_line("pytorch", chosen, 1298.8, "samples/s")
                        .endswith("in the probe 1754.2 samples/s, default settings 1754.2 (1.00x)"))
        restarted = tuning.Choice({}, probed=True)
        self.assertTrue(tuning.summary_line("pytorch", restarted, 1298.8, "samples/s", 1754.2,
                                            1754.2).endswith("(1.00x)"))

    def test_a_given_setting_is_not_probed(self):
        args = argparse.Namespace(probe_rounds=2)
        with redirect_stdout(io.StringIO()):
            choice = tuning.chosen({"threads": "1"}, "pytorch", [{}], None, args, "samples/s")
        self.assertEqual(choice.setting, {"threads": "1"})
        self.assertFalse(choice.probed)

    def test_timed_rate_counts_only_the_steps_after_the_warm_up(self):
        calls = []
        rate = tuning.timed_rate(lambda: calls.append(1), steps=5, warmup=3)
        self.assertEqual(len(calls), 8)
        self.assertGreater(rate, 0)


class TroupeRateTest(unittest.TestCase):
    def test_rate_from_the_step_records_after_the_warm_up(self):
        with tempfile.TemporaryDirectory() as directory:
            # A troupe that logs step s at 0.1 s each, except the warm-up's slow first step, and
            # an evaluation record; it also keeps the command it was given.
            fake = os.path.join(directory, "troupe")
            with open(fake, "w") as file:
                file.write(textwrap.dedent("""\
                    #!%s
                    import json, os, sys
                    out = sys.argv[sys.argv.index("--out") + 1]
                    os.makedirs(out, exist_ok=True)
                    steps = int([a for a in sys.argv if a.startswith("training.max_steps=")][0]
                                .split("=")[1])
                    with open(os.path.join(out, "metrics.jsonl"), "w") as log:
                        for step in range(1, steps + 1):
                            wall = 5.0 + 0.1 * step if step > 1 else 1.0
                            log.write(json.dumps({"step": step, "wall_s": wall}) + "\\n")
                        log.write(json.dumps({"step": steps, "wall_s": 99, "test_loss": 1}) + "\\n")
                    open(os.path.join(out, "command.json"), "w").write(json.dumps(sys.argv))
                    """ % sys.executable))
            os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
            out = os.path.join(directory, "run")
            rate = tuning.troupe_rate(fake, "job.toml", ["parallelism.threads=2"], 4, out, 64)
            self.assertAlmostEqual(rate, 640.0)
            with open(os.path.join(out, "command.json")) as file:
                command = json.load(file)
            self.assertIn("parallelism.threads=2", command)
            self.assertIn("training.max_steps=7", command)
            self.assertIn("metrics.log_interval=1", command)


class EnterPytorchTest(unittest.TestCase):
    def test_starts_again_with_the_settings_environment_and_threads(self):
        with tempfile.TemporaryDirectory() as directory:
            script = os.path.join(directory, "child.py")
            with open(script, "w") as file:
                file.write(textwrap.dedent("""\
                    import json, os, sys
                    sys.path.insert(0, %r)
                    import tuning
                    class Torch:
                        def set_num_threads(self, count):
                            print(json.dumps({"policy": os.environ.get("OMP_WAIT_POLICY"),
                                              "blas": os.environ.get("OPENBLAS_NUM_THREADS"),
                                              "threads": count, "argv": sys.argv[1:]}))
                    tuning.enter_pytorch(tuning.parse_setting(sys.argv[1], "pytorch"), Torch())
                    """ % BENCH))
            environment = dict(os.environ, OPENBLAS_NUM_THREADS="8")
            result = subprocess.run(
                [sys.executable, script, "OMP_WAIT_POLICY=PASSIVE,threads=2"], env=environment,
                capture_output=True, text=True, check=True)
        self.assertEqual(json.loads(result.stdout.splitlines()[-1]), {
            "policy": "PASSIVE", "blas": None, "threads": 2,
            "argv": ["OMP_WAIT_POLICY=PASSIVE,threads=2"]})


class RaceTest(unittest.TestCase):
    def arguments(self, **changes):
        parser = argparse.ArgumentParser()
        converge_race.add_arguments(parser)
        args = parser.parse_args([])
        args.troupe = "troupe"
        vars(args).update(changes)
        return args

    def test_each_async_row_names_what_its_ratio_is_against(self):
        args = self.arguments()
        rows = converge_race.rows_of(args)
        medians = {"sync-1-stage": (12.0, 3, 3), "sync-4-stages-1f1b-m1": (20.2, 3, 3),
                   "sync-4-stages-1f1b-m2": (17.0, 3, 3), "sync-4-stages-1f1b-m4": (15.5, 3, 3),
                   # Sooner, but only one run of three reached the target.
                   "sync-4-stages-1f1b-m8": (11.0, 1, 3),
                   "async-mak2": (12.6, 3, 3), "nesterov-mak2": (12.9, 3, 3)}
        with redirect_stdout(io.StringIO()) as printed:
            converge_race.print_ratios(args, rows, medians)
        lines = printed.getvalue().splitlines()
        self.assertIn("<- best 4-stage sync",
                      [line for line in lines if "sync-4-stages-1f1b-m4" in line][0])
        nesterov = [line for line in lines if "nesterov-mak2" in line][0]
        self.assertTrue(nesterov.endswith(
            "12.9 s: 0.83x best 4-stage sync (1f1b M=4), 1.07x one stage"), nesterov)

    def test_the_command_races_one_stage_every_sync_m_and_the_async_rows(self):
        args = self.arguments(sync_micro_batches=[2, 4], seeds=5)
        command = converge_race.converge_command(args, converge_race.rows_of(args))
        settings = [command[i + 1] for i, word in enumerate(command) if word == "--setting"]
        self.assertEqual(settings[0], 'sync-1-stage:parallelism.stages=1,parallelism.mode="sync",'
                                      'parallelism.micro_batches=1')
        self.assertEqual(settings[2], 'sync-4-stages-1f1b-m4:parallelism.stages=4,'
                                      'parallelism.mode="sync",parallelism.schedule="1f1b",'
                                      'parallelism.micro_batches=4')
        self.assertTrue(settings[4].startswith("nesterov-mak2:parallelism.stages=4,"))
        self.assertIn("training.target_accuracy=0.85", command)
        self.assertEqual(command[command.index("--seeds") + 1], "5")
        self.assertEqual(command[-1], "--no-prediction")
        own = self.arguments(job="gpt.toml", set=["training.max_steps=240"])
        own_command = converge_race.converge_command(own, converge_race.rows_of(own))
        self.assertNotIn("training.target_accuracy=0.85", own_command)
        self.assertIn("training.max_steps=240", own_command)


if __name__ == "__main__":
    unittest.main()
