"""Per-request sampling: greedy, temperature, top-k, top-p, seeds, stop strings, and SGLang's logit
processors: frequency, presence and repetition penalties, logit_bias and min_new_tokens.

Parameters are validated at submit time and the engine runs a frozen copy of what it validated,
so a bad value (NaN, None, a string, a mutation after submit) is the submitter's error, never a
failure inside the engine loop that other requests would feel.

The processors follow SGLang's semantics (sglang/srt/sampling/penaltylib, sampling_batch_info.py):
counts are over the request's output tokens only; the additive penalties (frequency: count times
penalty; presence: penalty once a token appeared; min_new_tokens: -inf on the stop tokens while the
output is shorter) come first, then repetition (a token that appeared has a positive logit divided
by the penalty, a negative one multiplied), then logit_bias is added; temperature, top-k and top-p
act on the result, and a greedy row takes its argmax. They are applied to the rows that use them,
all such rows of a batch at once; a batch where no row uses them runs exactly the path it ran before.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

# As SGLang: a temperature this small is greedy (dividing logits by 1e-40 would overflow to inf).
SAMPLING_EPS = 1e-6
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 256             # characters of one stop string (each is matched against the text's end at every token)
MAX_LOGIT_BIAS = 1024            # entries of one logit_bias
MIN_REPETITION_PENALTY = 0.01    # a seen token's positive logit is divided by it: 1e-300 is 0 in fp32 (logits inf)
LOGIT_BIAS_RANGE = 100.0         # OpenAI's [-100, 100]


class ParamError(ValueError):
    """A bad sampling parameter; `field` names it (the server turns it into OpenAI's `param`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def token_id_key(key: Any) -> Any:
    """A logit_bias key as JSON carries it ("42") turned into the token id 42; anything else is returned as it
    came, for validate() to refuse. ASCII digits only: str.isdigit() also takes "²" (which int() refuses) and
    "٣" or "３" (which int() reads as 3), and neither is a token id a client meant."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10:
        return int(key)
    return key


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    """A finite real number (an integer past fp64's range, as JSON may carry one, is not)."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


@dataclass
class SamplingParams:
    max_new_tokens: int = 32        # 0: prefill only (the prompt is cached, nothing is generated), as SGLang
    temperature: float = 0.0        # 0 = greedy
    top_k: int = 0                  # 0 = no top-k cut
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: Sequence[str] = field(default_factory=tuple)
    ignore_eos: bool = False
    priority: int = 0               # used by the "priority" eviction policy
    frequency_penalty: float = 0.0  # [-2, 2]: minus penalty x times the token appeared in the output
    presence_penalty: float = 0.0   # [-2, 2]: minus penalty once the token appeared in the output
    repetition_penalty: float = 1.0  # [0.01, 2]: 1 = off; a token that appeared is made less (>1) likely
    min_new_tokens: int = 0         # no EOS before this many output tokens (a stop string still ends it)
    logit_bias: Optional[dict] = None  # token id -> [-100, 100] added to its logit

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"these SamplingParams belong to a submitted request and are frozen; "
                                 f"build new SamplingParams for the next request instead of setting {name}")
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Raise ParamError (a ValueError) naming the field and what to change; normalises `stop` to a tuple
        and logit_bias keys to ints."""
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ParamError("max_new_tokens", f"max_new_tokens must be an integer >= 0 (0: prefill the prompt "
                                               f"into the cache, generate nothing), got {self.max_new_tokens!r}")
        if not _is_real(self.temperature) or self.temperature < 0:
            raise ParamError("temperature", f"temperature must be >= 0 (0 = greedy) and finite, got "
                                            f"{self.temperature!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ParamError("top_k", f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
            raise ParamError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not _is_int(self.seed) or not -2 ** 63 <= self.seed < 2 ** 63):
            raise ParamError("seed", f"seed must be None or a 64-bit integer in [-2**63, 2**63), got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ParamError("ignore_eos", f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not _is_int(self.priority) or abs(self.priority) >= 2 ** 62:
            raise ParamError("priority", f"priority must be an integer (higher = kept longer by the 'priority' "
                                         f"eviction policy), got {self.priority!r}")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is None or isinstance(stop, (bytes, bytearray)) or not isinstance(stop, (list, tuple)):
            raise ParamError("stop", f"stop must be a string or a list of non-empty strings, got {stop!r}")
        if any(not isinstance(s, str) or not s for s in stop) or len(stop) > MAX_STOP_STRINGS:
            raise ParamError("stop", f"stop must be a list of at most {MAX_STOP_STRINGS} non-empty strings, "
                                     f"got {stop!r}")
        long = [s for s in stop if len(s) > MAX_STOP_CHARS]
        if long:
            raise ParamError("stop", f"a stop string may have at most {MAX_STOP_CHARS:,} characters; one has "
                                     f"{len(long[0]):,}: shorten it")
        self._validate_processors()
        if not self.__dict__.get("_frozen"):
            self.stop = tuple(stop)
            if self.logit_bias is not None:
                self.logit_bias = {int(k): float(b) for k, b in self.logit_bias.items()}

    def _validate_processors(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not _is_real(value) or not -2.0 <= value <= 2.0:
                raise ParamError(name, f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
        if not _is_real(self.repetition_penalty) or not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 2.0:
            raise ParamError("repetition_penalty", f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 2] "
                                                   f"(1 = off), got {self.repetition_penalty!r}")
        if not _is_int(self.min_new_tokens) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ParamError("min_new_tokens", f"min_new_tokens must be an integer in [0, max_new_tokens "
                                               f"({self.max_new_tokens})], got {self.min_new_tokens!r}")
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
            raise ParamError("logit_bias", f"logit_bias must be an object of at most {MAX_LOGIT_BIAS} token id: "
                                           f"bias pairs, got {type(bias).__name__}")
        for k, b in bias.items():
            tok = token_id_key(k)
            if not _is_int(tok) or tok < 0:
                raise ParamError("logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {k!r}")
            if not _is_real(b) or not -LOGIT_BIAS_RANGE <= b <= LOGIT_BIAS_RANGE:
                raise ParamError("logit_bias", f"logit_bias values must be numbers in [-100, 100], got {b!r} "
                                               f"for token {k!r}")

    def frozen(self) -> "SamplingParams":
        """A validated, normalised copy that refuses mutation: what a request actually runs with."""
        self.validate()
        bias = None if self.logit_bias is None else {int(k): float(b) for k, b in self.logit_bias.items()}
        copy = SamplingParams(max_new_tokens=int(self.max_new_tokens), temperature=float(self.temperature),
                              top_k=int(self.top_k), top_p=float(self.top_p),
                              seed=None if self.seed is None else int(self.seed), stop=tuple(self.stop),
                              ignore_eos=bool(self.ignore_eos), priority=int(self.priority),
                              frequency_penalty=float(self.frequency_penalty),
                              presence_penalty=float(self.presence_penalty),
                              repetition_penalty=float(self.repetition_penalty),
                              min_new_tokens=int(self.min_new_tokens), logit_bias=bias or None)
        object.__setattr__(copy, "_frozen", True)
        return copy

    def __copy__(self) -> "SamplingParams":
        return dataclasses.replace(self)

    @property
    def processed(self) -> bool:
        """Whether any logit processor (penalties, logit_bias, min_new_tokens) is on."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_new_tokens)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    def make_generator(self, device: torch.device) -> Optional[torch.Generator]:
        if self.greedy:
            return None
        g = torch.Generator(device=device)
        if self.seed is not None:
            g.manual_seed(int(self.seed) % 2 ** 64)   # a negative seed (SGLang takes any int64) as its bits
        else:
            g.seed()
        return g


def sample_row(row: torch.Tensor, p: SamplingParams, g: Optional[torch.Generator]) -> int:
    """One non-greedy token from one row of logits, as SGLang samples: softmax at the temperature, then top-k
    and top-p both cut on those probabilities ("joint": a token must pass both; top-p is not measured on
    the top-k tokens renormalised, which keeps far fewer, as in HF and vLLM)."""
    probs = torch.softmax(row.float() / float(p.temperature), dim=-1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError("the model produced non-finite logits for this request; it cannot be sampled")
    if p.top_k <= 0 and p.top_p >= 1.0:
        return int(torch.multinomial(probs, 1, generator=g).item())
    if 0 < p.top_k < probs.numel():
        kept, order = torch.topk(probs, p.top_k)          # sorted, highest first
    else:
        kept, order = torch.sort(probs, descending=True)
    if p.top_p < 1.0:
        drop = torch.cumsum(kept, dim=-1) - kept > p.top_p   # keep the smallest run whose mass reaches top_p
        kept = kept.masked_fill(drop, 0.0)
    return int(order[torch.multinomial(kept, 1, generator=g)].item())


def process_logits(logits: torch.Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]],
                   stop_ids: Sequence[int] = ()) -> torch.Tensor:
    """`logits` [R, vocab] with each row's penalties, min_new_tokens and logit_bias applied, the rows that
    use them processed together; `logits` itself (untouched) when no row does. `outputs[r]`: row r's
    output tokens so far; `stop_ids`: the tokens min_new_tokens holds back (EOS)."""
    rows = [r for r, p in enumerate(params) if p.processed]
    if not rows:
        return logits
    dev, vocab = logits.device, logits.shape[-1]
    ps = [params[r] for r in rows]
    sub = logits[torch.tensor(rows, device=dev)].float()
    lengths = [len(outputs[r]) for r in rows]
    counts = torch.zeros((len(rows), vocab), dtype=torch.float32, device=dev)
    if sum(lengths):
        row_of = torch.repeat_interleave(torch.arange(len(rows), device=dev), torch.tensor(lengths, device=dev))
        toks = torch.tensor([t for r in rows for t in outputs[r]], dtype=torch.long, device=dev)
        counts.index_put_((row_of, toks), torch.ones_like(toks, dtype=torch.float32), accumulate=True)

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=dev).unsqueeze(1)

    sub -= column([p.frequency_penalty for p in ps]) * counts
    sub -= column([p.presence_penalty for p in ps]) * (counts > 0)
    early = [i for i, p in enumerate(ps) if lengths[i] < p.min_new_tokens]
    stops = [t for t in stop_ids if 0 <= t < vocab]
    if early and stops:
        sub[torch.tensor(early, device=dev).unsqueeze(1), torch.tensor(stops, device=dev)] = float("-inf")
    scale = torch.where(counts > 0, column([p.repetition_penalty for p in ps]), 1.0)
    sub = torch.where(sub < 0, sub * scale, sub / scale)
    bias = [(i, t, b) for i, p in enumerate(ps) for t, b in (p.logit_bias or {}).items()]
    if bias:
        if any(t >= vocab for _, t, _ in bias):
            raise ParamError("logit_bias", f"logit_bias names a token id outside the vocabulary (0..{vocab - 1})")
        bi, bt, bv = zip(*bias)
        sub[torch.tensor(bi, device=dev), torch.tensor(bt, device=dev)] += torch.tensor(bv, device=dev)
    out = logits.float() if logits.dtype != torch.float32 else logits.clone()
    out[torch.tensor(rows, device=dev)] = sub
    return out


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[Optional[torch.Generator]], outputs: Optional[Sequence[Sequence[int]]] = None,
           stop_ids: Sequence[int] = ()) -> list[int]:
    """One token per row of `logits` [R, vocab]; greedy rows share one vectorised argmax."""
    if outputs is not None:
        logits = process_logits(logits, params, outputs, stop_ids)
    out = logits.argmax(dim=-1).tolist()
    for r, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            out[r] = sample_row(logits[r], p, g)
    return out


def sample_isolated(logits: torch.Tensor, rows: list[int], owners: list,
                    stop_ids: Sequence[int] = ()) -> tuple[list, list]:
    """`sample` for the requests `owners` (each with .params, .generator and .output_ids) at `rows` of
    `logits`: ([(owner, token)], [(owner, exception)]). One bad row fails only its owner."""
    if not rows:
        return [], []
    index = torch.tensor(rows, device=logits.device)
    # the seeded rows' generator states: a batch that fails part way has drawn from some of them already,
    # and the rows sampled again below must draw what they would have (the same tokens as alone); unseeded
    # rows draw at random either way, so their states (~5 KB each, every step) are not copied
    states = [o.generator.get_state() if o.generator is not None and o.params.seed is not None else None
              for o in owners]
    try:
        toks = sample(logits[index], [o.params for o in owners], [o.generator for o in owners],
                      [o.output_ids for o in owners], stop_ids)
        return list(zip(owners, toks)), []
    except Exception:
        pass
    for o, state in zip(owners, states):
        if state is not None:
            o.generator.set_state(state)
    got, failed = [], []
    for r, o in zip(rows, owners):  # find the culprit(s): one row at a time
        try:
            got.append((o, sample(logits[r:r + 1], [o.params], [o.generator], [o.output_ids], stop_ids)[0]))
        except Exception as exc:
            failed.append((o, exc))
    return got, failed
