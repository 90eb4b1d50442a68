"""Length curriculum (DeltaFormer paper §4.1): train at a short length, double it whenever the accuracy
at the current length reaches the threshold, until the final length."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LengthCurriculum:
    start_length: int
    final_length: int
    threshold: float
    length: int = field(init=False)
    solved: bool = field(init=False, default=False)  # the final length has reached the threshold

    def __post_init__(self) -> None:
        if not 1 <= self.start_length <= self.final_length:
            raise ValueError(
                "curriculum needs 1 <= start_length <= final_length, got "
                f"{self.start_length}, {self.final_length}"
            )
        self.length = self.start_length

    def update(self, accuracy: float) -> bool:
        """Record an accuracy measured at the current length; True when the length changed."""
        if accuracy < self.threshold:
            return False
        if self.length >= self.final_length:
            self.solved = True
            return False
        self.length = min(2 * self.length, self.final_length)
        return True
