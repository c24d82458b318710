#!/usr/bin/env python3
"""golden.py's rules on made-up logits (no model): ranking and ties, the greedy record, the
near-tie allowance, the logit checks, the file's round trip. Plain Python (CTest golden_rules)."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402

VOCAB = 40


def logits_with(top):
    """Logits over VOCAB: `top` {id: value}, every other id at -10 - id / 100."""
    return [top.get(i, -10.0 - i / 100) for i in range(VOCAB)]


class ScriptedReference:
    """Logits after each step from a list; records what it was fed."""

    def __init__(self, steps):
        self.steps, self.fed = steps, []

    def start(self, ids):
        self.fed.append(list(ids))
        return self.steps[0]

    def next(self, token):
        self.fed.append(token)
        return self.steps[len(self.fed) - 1]


def record_of(steps, eos=()):
    reference = ScriptedReference(steps)
    record, _ = golden.greedy_run(reference, "hi", [5, 6], list(eos), lambda ids: ",".join(map(str, ids)),
                                  steps=len(steps))
    return record, reference


class Ranking(unittest.TestCase):
    def test_largest_first_lowest_id_on_ties(self):
        self.assertEqual(golden.ranked([1.0, 3.0, 3.0, 2.0], 3), [(1, 3.0), (2, 3.0), (3, 2.0)])

    def test_non_finite_logit_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "logit 1 is nan"):
            golden.ranked([1.0, float("nan")], 1)


class GreedyRun(unittest.TestCase):
    def test_records_tokens_margins_top_logits_and_first_eos(self):
        steps = [logits_with({7: 5.0, 3: 4.5}), logits_with({2: 1.0, 9: 0.25}), logits_with({2: 3.0, 8: 2.0}),
                 logits_with({4: 1.0, 1: 0.0}), logits_with({4: 1.0, 1: 0.5})]
        record, reference = record_of(steps, eos=[2])
        self.assertEqual(record["tokens"], [7, 2, 2, 4, 4])
        self.assertEqual(reference.fed, [[5, 6], 7, 2, 2, 4])  # never stops at EOS
        self.assertEqual(record["first_eos"], 1)
        self.assertEqual(record["runner_up"], [3, 9, 8, 1, 1])
        self.assertEqual(record["margin"], [0.5, 0.75, 1.0, 1.0, 0.5])
        self.assertEqual(len(record["top_logits"]), golden.LOGIT_STEPS)
        self.assertEqual(len(record["top_logits"][0]), golden.TOP_K)
        self.assertEqual(record["top_logits"][0][:2], [[7, 5.0], [3, 4.5]])
        self.assertEqual(record["continuation"], "7,2,2,4,4")


class Checks(unittest.TestCase):
    def setUp(self):
        self.steps = [logits_with({7: 5.0, 3: 4.9995}), logits_with({2: 1.0, 9: 0.9}), logits_with({1: 1.0, 8: 0.0}),
                      logits_with({4: 1.0, 1: 0.0}), logits_with({4: 1.0, 1: 0.0})]
        self.record, _ = record_of(self.steps)

    def test_same_run_passes(self):
        result = golden.check_record(self.record, self.record["tokens"], self.steps[:4], 1e-3, 5)
        self.assertTrue(result["ok"], result["note"])
        self.assertEqual((result["same"], result["worst"], result["note"]), (5, 0.0, ""))

    def test_runner_up_within_the_margin_is_a_near_tie(self):
        tokens = [3, 0, 0, 0, 0]  # step 0's margin is 5e-4
        result = golden.check_record(self.record, tokens, self.steps[:1], 1e-3, 5)
        self.assertTrue(result["ok"], result["note"])
        self.assertEqual(result["same"], 0)
        self.assertIn("near-tie divergence at step 0", result["note"])

    def test_runner_up_beyond_the_margin_is_a_real_divergence(self):
        tokens = self.record["tokens"][:1] + [9, 0, 0, 0]  # step 1's margin is 0.1
        result = golden.check_record(self.record, tokens, self.steps[:1], 1e-3, 5)
        self.assertFalse(result["ok"])
        self.assertEqual(result["same"], 1)
        self.assertIn("real divergence at step 1", result["note"])

    def test_a_token_other_than_the_runner_up_is_a_real_divergence(self):
        tokens = [11, 0, 0, 0, 0]
        self.assertFalse(golden.check_record(self.record, tokens, self.steps[:1], 1.0, 5)["ok"])

    def test_fewer_tokens_fail(self):
        result = golden.check_record(self.record, self.record["tokens"][:3], self.steps[:1], 1e-3, 5)
        self.assertFalse(result["ok"])
        self.assertIn("stopped after 3 tokens", result["note"])

    def test_a_logit_off_by_more_than_the_tolerance_fails(self):
        shifted = list(self.steps[2])
        shifted[8] += 2e-3
        result = golden.check_record(self.record, self.record["tokens"], self.steps[:2] + [shifted], 1e-3, 5)
        self.assertFalse(result["ok"])
        self.assertAlmostEqual(result["worst"], 2e-3)

    def test_an_id_rising_into_the_top_fails(self):
        raised = list(self.steps[0])
        raised[39] = 4.0  # not among the golden top-20 (whose 20th is about -10.2)
        result = golden.check_record(self.record, self.record["tokens"], [raised], 1e-3, 5)
        self.assertFalse(result["ok"])
        self.assertIn("id 39", result["note"])


class File(unittest.TestCase):
    def test_write_then_load(self):
        record, _ = record_of([logits_with({1: 1.0})] * 3)
        document = {"format": golden.FORMAT, "reference": "scripted", "steps": 3, "prompts": [record, record]}
        with tempfile.TemporaryDirectory() as workdir:
            path = os.path.join(workdir, "golden.json")
            golden.write_golden(path, document)
            self.assertEqual(golden.load_golden(path), document)

    def test_other_format_is_an_error(self):
        with tempfile.TemporaryDirectory() as workdir:
            path = os.path.join(workdir, "golden.json")
            with open(path, "w") as f:
                f.write('{"format": "something else"}')
            with self.assertRaisesRegex(ValueError, "format 'something else'"):
                golden.load_golden(path)


if __name__ == "__main__":
    unittest.main()
