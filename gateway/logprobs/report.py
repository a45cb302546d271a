"""What a translation had to do to get exact bytes: counted, never hidden."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TranslationReport:
    """Counters filled while parsing and rendering one response (summed into metrics later)."""

    from_ids: int = 0  # sampled tokens whose bytes came from a token id
    aligned: int = 0  # sampled tokens repaired by aligning lossy strings against the text
    ambiguous_positions: list[int] = field(default_factory=list)  # sampled tokens left ambiguous
    ambiguous_candidates: int = 0  # alternatives whose bytes could not be recovered
    sentinels: int = 0  # null / -inf / NaN / float32-lowest logprobs mapped to -9999.0
    collisions: int = 0  # completions dict keys that two candidates shared, kept apart
    collisions_merged: int = 0  # ... that could not be kept apart (same bytes, no id)
    # fragments spelled per character (no tokenizer: b"", the completing token the whole character);
    # a stream counts each empty lossy entry as it comes, an end-of-sequence one included
    per_character: int = 0

    def merge(self, other: TranslationReport) -> None:
        self.from_ids += other.from_ids
        self.aligned += other.aligned
        self.ambiguous_positions.extend(other.ambiguous_positions)
        self.ambiguous_candidates += other.ambiguous_candidates
        self.sentinels += other.sentinels
        self.collisions += other.collisions
        self.collisions_merged += other.collisions_merged
        self.per_character += other.per_character
