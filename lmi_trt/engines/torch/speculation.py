"""The built-in decode loop's speculative decoding, the parts that are not the loop: n-gram drafts, when a
request drafts at all, and the verification of a step's drafts on the device.

Verification (``verify``). A speculating request feeds its last token and k draft tokens in one step;
the target's token at each of the k + 1 positions is chosen exactly as a decode step would choose it
there, with the sampler state that position would have (penalty counts including the drafts before
it, the generated count for min_new_tokens and the request's random stream), assuming the drafts
before it were accepted. The request keeps the longest prefix of drafts equal to those tokens, plus
the target's token after it. Both drafters here are deterministic given the tokens so far (an
n-gram's continuation; a draft model's argmax, vLLM's default ``draft_sample_method="greedy"``,
vllm/config/speculative.py), so their proposal distribution q is one-hot, and standard rejection
sampling (accept with min(1, p/q), else sample norm(max(0, p − q))) reduces to: accept with
probability p(draft), else sample p with the draft removed. Taking the target's token with the same
uniforms a decode step would use, and accepting when it equals the draft, realises exactly that
(the race picks the draft with probability p(draft); when it does not, what it picks is distributed
as p without the draft). So greedy requests get the tokens decoding one at a time gives, and sampled
ones the same distribution; a seeded request even gets the same tokens.

When to draft (``Drafting``). A step that verifies drafts needs the newest tokens on the host before
it is planned, so the loop waits for each step while anyone drafts, and it pays the k extra
positions per request: speculation pays where a step is bound by reading the weights (few requests)
and drafts are accepted. Hence three rules: no drafting in steps with more running requests than
``max_concurrency`` (TensorRT-LLM's ``max_concurrency``, vLLM's ``disable_by_batch_size``; the
torch engine's default ``DEFAULT_MAX_CONCURRENCY``); a request whose drafts keep being rejected
(an exponential average of the accepted fraction under ``ACCEPTANCE_FLOOR``), or whose n-gram finds
no match ``MISSES`` steps running, stops drafting for a number of the steps it could draft in (few enough
requests, no prompt tokens) that doubles each time (up to ``MAX_BACKOFF``) and then tries again; and a
step with nobody drafting runs as an ordinary decode step, pipelined and replayed as a CUDA graph. A step
that cannot verify (more requests, or prompt tokens) costs no per-request work and does not wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...ngram import NgramIndex
from .gpu_sampler import Mode, Rows, sample

# Speculation off in steps with more running requests: up to 32 requests × (1 + 4) positions the ~1B
# models this loop serves stay bound by reading their weights on an H100 (≈ 300 tokens of matmul per
# weight byte read), and the host's per-request work of a step that waits for the GPU stays small
# against the step; benchmarks/gpu_spec.py measures both sides of it.
DEFAULT_MAX_CONCURRENCY = 32
ACCEPTANCE_FLOOR = 0.2  # below this share of drafts accepted (recent average) a request pauses drafting
MISSES = 4  # n-gram steps without a match before a request pauses drafting
MAX_BACKOFF = 64  # longest pause, in the request's steps


@dataclass
class Drafting:
    """One request's speculation state (the loop's ``_Row`` holds one when speculation is on)."""

    ngram: NgramIndex | None = None
    draft_filled: int = 0  # positions the draft model's cache holds for this request
    acceptance: float = 1.0  # recent share of its drafts accepted
    misses: int = 0
    pause: int = 0  # steps it could draft in left before it drafts again
    backoff: int = 1
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def eligible(self) -> bool:
        return self.pause == 0

    def stepped(self) -> None:
        """A step it could draft in (``DecodeLoopBackend._may_speculate``) ran, drafting or not."""
        self.pause = max(0, self.pause - 1)

    def _back_off(self) -> None:
        self.pause, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)

    def missed(self) -> None:
        """Its n-gram found no match this step."""
        self.misses += 1
        if self.misses >= MISSES:
            self.misses = 0
            self._back_off()

    def verified(self, proposed: int, accepted: int) -> None:
        """A step verified ``proposed`` drafts, of which the first ``accepted`` were kept."""
        self.misses = 0
        rate = accepted / proposed
        self.acceptance = 0.5 * self.acceptance + 0.5 * rate
        if self.acceptance < ACCEPTANCE_FLOOR:
            self.acceptance = 2 * ACCEPTANCE_FLOOR  # the next try after the pause starts from here
            self._back_off()
        elif rate >= 0.5:
            self.backoff = 1


def accepted_counts(targets: torch.Tensor, drafts: torch.Tensor, proposed: torch.Tensor) -> torch.Tensor:
    """[S] drafts kept per sequence: the length of the prefix of ``drafts`` [S, K] equal to ``targets``
    [S, K + 1]'s first K and within the ``proposed`` [S] drafts (graph-capturable: no host sync)."""
    width = drafts.size(1)
    live = torch.arange(width, device=drafts.device).unsqueeze(0) < proposed.unsqueeze(1)
    match = (targets[:, :width] == drafts) & live
    return match.long().cumprod(1).sum(1)


def position_rows(rows: Rows, drafts: torch.Tensor, proposed: torch.Tensor) -> Rows:
    """``rows`` ([S] sequences, each repeated K + 1 times: [S · (K + 1)]) with each position's
    generated-token counts: the sequence's, plus the drafts before that position (those within
    ``proposed``), as decoding them one at a time would have counted them."""
    seqs, width = drafts.shape
    vocab = rows.counts.size(1)
    live = (torch.arange(width, device=drafts.device).unsqueeze(0) < proposed.unsqueeze(1)).float()
    added = torch.zeros(seqs, width + 1, vocab, device=drafts.device)
    added[:, 1:].scatter_add_(2, drafts.unsqueeze(2), live.unsqueeze(2))
    counts = rows.counts + added.cumsum(1).view(seqs * (width + 1), vocab)
    return Rows(**{name: getattr(rows, name) for name in Rows.__dataclass_fields__} | {"counts": counts})


def verify(
    logits: torch.Tensor,
    rows: Rows | None,
    drafts: torch.Tensor,
    proposed: torch.Tensor,
    generated: torch.Tensor,
    eos: torch.Tensor,
    mode: Mode,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's tokens at each position of a verification step and how many of them a sequence keeps.

    ``logits`` [S · (K + 1), vocab] fp32, sequence-major; ``rows`` the sampler state of each position
    (``position_rows``; None in GREEDY mode, which reads none); ``drafts`` [S, K] and ``proposed`` [S]
    (the drafts each sequence really has; fewer positions are padding); ``generated`` [S · (K + 1)]
    the tokens generated before each position; ``bias`` [S · (K + 1), vocab] or None. Returns tokens,
    raw log-probabilities and status [S, K + 1] (``gpu_sampler.sample``'s, per position) and [S] the
    number of tokens each sequence emits: the accepted drafts and the target's token after them."""
    seqs, width = drafts.size(0), drafts.size(1) + 1
    tokens, logprobs, status = sample(logits, rows, generated, eos, mode, bias)
    tokens, logprobs, status = (t.view(seqs, width) for t in (tokens, logprobs, status))
    return tokens, logprobs, status, accepted_counts(tokens, drafts, proposed) + 1
