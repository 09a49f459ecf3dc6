"""Default sampling settings, chosen by measurement for the embedded model (evidence: docs/quality.md).

SmolLM2-135M-Instruct, measured on this project's CPU (issue 6), 1024 tokens per run, same seed:
* No penalty loops: after a story prompt the text ended in one sentence repeated ~60 times
  (repeated-sentence rate 82%, Distinct-4 0.17, zlib compression ratio 10.4).
* Mild penalties loop too: 1.05 over 1024 (Distinct-4 0.50, 48% repeated sentences), 1.1 over
  1024 ("and he just ate it again" x 15) or over 256 (a paragraph repeated).
* The paper's 1.2 over 1024 is too harsh for this model: on real prose it costs +0.58 nats per token
  against the raw model, and after an 11K-token prose prefix (the window full of real text) it
  wrote word salad from the first token (NLL 5.0 with YaRN, 5.5 without; prose is ~2.6-3.2).
* 1.15 over 512 sits between: +0.34 nats on real prose; after the story prompt NLL 2.59,
  Distinct-4 0.996, no repeated sentence, compression 1.92 (an encyclopedia excerpt: 3.22, 0.975,
  0%, 1.99); after the 11K-token prefix, with YaRN (factor 1.5), readable prose (NLL 2.8;
  without YaRN the same run turned to salad, NLL 5.75 by position ~11,600).
* min-p 0.1 cuts the tail that turns a small model's text into noise; temperature 1 keeps the
  model's own distribution (0.8 moved real prose's NLL by +0.13 nats); for long texts see below.
* Long runs (docs/quality.md): with 1.15 / 512 alone a 50K-token run wrote lists of words at
  8-16K and loops of full-width characters at 24-38K; with DRY 0.8 added (a token extending a
  repeat of 2+ tokens loses logit) its words grew longer token after token (mean word length 4.2
  -> 6.0 by 8K) and ran together from ~8.5K on ("whilesometimesoneverythingthat..."): the penalty
  pushes the common " word" tokens down, never their space-less twins. Continuing that run's first
  6,000 tokens for 5,000 more (benchmarks/sampling_probe.py): min-p 0.2 ran words together by 7.5K;
  DRY without a token penalty looped ("whamp,whamp"); 1.1 / 256 + DRY kept words but wrote lists;
  1.05 / 512 + DRY kept grammatical prose (word length 4.4-5.2, Distinct-4 0.964, no repeated
  sentence). `scripts` "auto" keeps the text in the prefix's scripts: the full-width loops need a
  first full-width byte, which it never draws (and 1.05 without it drifted into them, 69%).
* With 1.05 / 512 and DRY 0.8 a run (run-009) chanted from ~5K tokens ("Mine, Mine, Mine."):
  tokens 4,000-8,000 had Distinct-4 0.859, compression 3.68. Replayed from its 4,000th token for
  4,000 more: DRY 1.5 gave 0.975 and 2.98 (prose), penalty 1.1 with DRY 0.8 gave 0.939 and 2.36
  (ending in a list). Hence DRY 1.5.
* With DRY 1.5 growing as 1.75^(n-2) with the length n of a repeat, run-010 (100K target) slid
  into run-together words, invented names and letter strings in 31 of 152 stretches of 500
  tokens (to 76K; 30 of them before 42K): respelling a phrase without its spaces is the cheapest
  way out of a long repeat. From its 11,000th token, base 1.2 kept prose for 4,000 tokens where
  temperature 0.7/0.8, min-p 0.2 and DRY allowed length 4 slid or looped; a whole run with base
  1.2 (run-012) had 1 such stretch in its first 40 (20,367 tokens; run-010: 12 of its first 40).
  Hence DRY base 1.2.
* Lists of invented names (one or two per line) then filled half of a 100K-token run with these
  settings (penalty 1.05 over 512): 51% of its 500-token stretches degenerate, 94-100% between 8K
  and 32K. From the prefix, 10K tokens, two seeds each: 7 and 7 of 20 stretches degenerate with
  1.05 / 512, 8 and 12 with the whole prefix kept in view (sinks 192), 0 and 0 with 1.1 over 1024;
  a whole 100K run with 1.1 / 1024 (run-003, docs/quality.md): 4% degenerate, judge NLL 1.95-2.27
  per 8K, Distinct-4 0.977-0.993 per 10K. Hence 1.1 over 1024.
* Over seeds (issue 24, docs/quality.md), temperature 1 still slid into lists and litanies of
  sentences opening alike: 32% and 31% of the 500-token stretches of 32K-token runs (seed 1, a prose
  prefix and a request), 34% of a 100K run (seed 0). Temperature 1.3, 3 seeds x 32K each way: 0%,
  8%, 0% continuing the prefix and 0%, 8%, 0% answering the request (the rest: words run together),
  judge NLL 2.9-3.5 per 8K, as real prose scores (2.6-3.2). Hence temperature 1.3. Confirmed over
  3 seeds x 100K: 9%, 13%, 0% continuing the prefix (mean 7%), 1%, 11%, 1% answering the request
  (mean 4%), judge NLL 2.7-3.6 per 8K with no cliff; what fails is words run together.
* Under the integer products (2026-11-28) the same screen found 2/7.5/5.0% continuing the prefix and
  3.5/8.5/11.6% answering the request (mean 7.9%), still words run together: glued pairs (",the",
  "DragonbornSavior"), hyphen chains, capitals without end and codes hundreds of characters long.
  `spacing` bans the glued pairs and `max_word` 24 cuts every word at 24 characters (Paradise Lost's
  longest is 18): over the same 3 seeds x 100K, answering the request 7.9% -> 2.5% (worst seed
  11.6% -> 3.5%), no stretch run together; continuing the prefix 4.8% -> 5.5% (seed 2 7.5% -> 14%: a
  catalog of invented compounds neither rule reaches); six runs 6.4% -> 4.0% (docs/quality.md).
  Hence both on.
* What was left were catalogs: hundreds of words in a row opening with a capital ("Ethnicreligion,
  Ethnicspirit, ...", "HOLLAMSGOVERDON—WHATSAWAY—..."), in four runs of thirteen, among them the one
  seed above 10% (prefix seed 2, 14%). Public-domain books hold at most 17 such words in a row (a
  bibliography's list of plays). `max_capitalised` 24 ends such a run at 24 words: continuing the
  prefix, seeds 1-7, 0/1.0/1.5/0/2.5/0/1.5% (before 0/14/2.5/2.5/1.0/0/1.0%), judge NLL per 8K means
  3.14-3.27; answering the request, seeds 4-6 unchanged (docs/quality.md). Hence on.
Context: past the trained 8192 positions a 4K context window keeps the model as trained
(`automatic_window`); as configured, the NLL of real prose rises from ~2.9 to 5.5-7.3 nats past
12K positions. End-of-text tokens are suppressed unless the run stops at them (`suppressed_ids`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tokenswift_cli.config import DEFAULT_SINKS, AutoWindow, Keep, SamplingConfig

EMBEDDED = SamplingConfig(
    temperature=1.3, min_p=0.1, penalty=1.1, penalty_window=1024, dry_multiplier=1.5, dry_base=1.2, scripts=("auto",),
    spacing=True, max_word=24, max_capitalised=24,
)  # fmt: skip
# The TokenSwift paper's settings (theta 1.2 over W 1024, min-p 0.1), measured there on 7-8B models.
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, penalty=1.2, penalty_window=1024)


def default_sampling(model_name: str = "default") -> SamplingConfig:
    """The sampling a run gets when the user sets none: measured for the embedded model, the paper's else."""
    return EMBEDDED if model_name == "default" else PAPER


# Attention span of the embedded model's automatic window (sinks included): on held-out prose it
# scores within 0.01 nats of the full trained 8192 (docs/quality.md) at half the attention cost.
EMBEDDED_WINDOW_SPAN = 4096


def automatic_window(model_name: str = "default", sinks: Keep = DEFAULT_SINKS) -> AutoWindow:
    """`--context-window auto`: measured for the embedded model; the trained length for others. The kept
    tokens (`--keep`) count in the span: the more are kept, the fewer recent ones."""
    if model_name != "default":
        return AutoWindow(sinks=sinks)
    if isinstance(sinks, int):
        return AutoWindow(sinks=sinks, size=EMBEDDED_WINDOW_SPAN - sinks)
    return AutoWindow(sinks=sinks, span=EMBEDDED_WINDOW_SPAN)  # "prompt": sized once the prompt is known


def suppressed_ids(sampling: SamplingConfig, eos_ids: Sequence[int], *, stop_at_eos: bool) -> SamplingConfig:
    """`sampling` with the end-of-text tokens never drawn, unless the run stops at them.

    Recorded in the run's settings with the rest of the sampling, so resume and the plain baseline
    suppress exactly the same tokens.
    """
    if stop_at_eos:
        return sampling
    merged = tuple(sorted({*sampling.suppress_token_ids, *(int(t) for t in eos_ids)}))
    return dataclasses.replace(sampling, suppress_token_ids=merged)
