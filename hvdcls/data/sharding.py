"""Which samples each rank reads: computed once, here, and used by both backends.

Training: every epoch the whole index is shuffled with a generator seeded by (seed, epoch), so
all ranks agree on the permutation without talking. It is padded by wrapping around to a
multiple of the world size and dealt out round-robin, so every rank holds the same number of
samples; incomplete batches are dropped, so every rank runs the same number of steps and no
rank waits in an all-reduce that the others never join (Horovod's "stall" warning).

Validation: no shuffling, no padding, rank r takes samples r, r+N, r+2N, ... Ranks may then
differ by one sample, which keeps the reduced accuracy exact: sum of correct over ranks / sum
of counts over ranks; but never by a batch (training.zero=3's forwards are collectives).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hvdcls.errors import UserError


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


BALANCED_STREAM = 7  # a generator stream of its own: the balanced draw is not the permutation's


def class_balanced_weights(labels: np.ndarray) -> np.ndarray:
    """data.sampler=balanced: each sample's probability of being drawn, so that every class
    present is drawn equally often in expectation (1 / (classes x its class's count))."""
    labels = np.asarray(labels)
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (len(classes) * counts[inverse])


def balanced_draw(weights: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """An epoch of len(weights) indices drawn with replacement by `weights`: every rank draws
    the same from (seed, epoch), without talking."""
    rng = np.random.default_rng([seed, epoch, BALANCED_STREAM])
    return rng.choice(len(weights), size=len(weights), replace=True, p=weights / weights.sum())


def at_least_one_step(shards) -> None:
    """A world that cannot fill one step stops with one line (TrainShards, ElasticShards)."""
    if shards.steps_per_epoch < 1:
        per_step = shards.batch_size * shards.backward_passes * shards.world_size
        raise UserError(
            f"{shards.num_samples} training samples are too few for one step of {per_step} "
            f"(training.batch_size={shards.batch_size} x horovod.backward_passes_per_step="
            f"{shards.backward_passes} x {shards.world_size} ranks): lower the batch size")


@dataclass(frozen=True)
class TrainShards:
    num_samples: int
    world_size: int
    rank: int
    batch_size: int  # per backward pass
    backward_passes: int = 1  # micro-batches per optimizer step
    seed: int = 0
    # data.sampler=balanced: per-sample draw probabilities (class_balanced_weights); None: each
    # sample once an epoch, shuffled. Either way an epoch has num_samples entries, so the steps
    # per epoch and every rank's share are the same.
    weights: Optional[np.ndarray] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        at_least_one_step(self)

    @property
    def samples_per_rank(self) -> int:
        return -(-self.num_samples // self.world_size)  # ceil

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch, the same on every rank."""
        return self.samples_per_rank // (self.batch_size * self.backward_passes)

    def padded_order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation, wrapped around to samples_per_rank x world_size entries."""
        if self.weights is not None:
            order = balanced_draw(self.weights, self.seed, epoch)
        else:
            order = epoch_permutation(self.num_samples, self.seed, epoch)
        return np.resize(order, self.samples_per_rank * self.world_size)  # wraps around

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's samples for `epoch`, in reading order (incomplete batches dropped)."""
        mine = self.padded_order(epoch)[self.rank::self.world_size]
        return mine[:self.steps_per_epoch * self.batch_size * self.backward_passes]

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's micro-batches for `epoch`: steps_per_epoch x backward_passes of them."""
        mine = self.indices(epoch)
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]


@dataclass(frozen=True)
class BalancedShards(TrainShards):
    """TrainShards with per-rank batch sizes (training.balance): the same steps per epoch and
    the same samples in each step as equal batches would give, split between the ranks at the
    plan's offsets instead of round-robin. Step s, pass p covers entries (s*P + p)*B ..
    (s*P + p + 1)*B of the epoch's padded permutation (B: the global batch per pass); rank r
    takes the `batches[r]` entries after the `batches[:r]` ones. Any plan, any step: together
    the ranks read each entry of the step once, so a plan can change at any step boundary."""

    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def balanced_batches(self, epoch: int, batches: tuple, first_step: int,
                         stop_step: Optional[int] = None) -> list[np.ndarray]:
        """This rank's micro-batches for steps first_step .. stop_step-1 under `batches`
        (per-rank sizes summing to the global batch)."""
        if len(batches) != self.world_size or sum(batches) != self.global_batch():
            raise ValueError(f"plan {batches} does not split {self.global_batch()} over "
                             f"{self.world_size} ranks")
        order = self.padded_order(epoch)
        stop = self.steps_per_epoch if stop_step is None else stop_step
        offset, size, total = sum(batches[:self.rank]), batches[self.rank], self.global_batch()
        starts = (k * total + offset for k in range(first_step * self.backward_passes,
                                                    stop * self.backward_passes))
        return [order[start:start + size] for start in starts]


@dataclass(frozen=True)
class ElasticShards:
    """The rest of one epoch, dealt over the world as it is now (elastic training).

    `consumed` samples of the epoch's permutation are done: exactly its first `consumed`
    entries, because each step takes the next batch_size x backward_passes x world_size
    entries dealt round-robin. After a change of world size the rest is dealt over the new
    world, so within an epoch no sample is read twice and none is skipped except the last
    incomplete step's (fewer than one step's worth). No wrap-around padding: that would
    read samples twice.
    """

    num_samples: int
    world_size: int
    rank: int
    batch_size: int
    backward_passes: int = 1
    seed: int = 0

    def __post_init__(self):
        at_least_one_step(self)

    @property
    def per_step(self) -> int:
        """Samples one optimizer step consumes over the whole world."""
        return self.batch_size * self.backward_passes * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        """Steps of a whole epoch at this world size: what `batches(epoch, 0)` yields (in
        micro-batches, x backward_passes), and what the trainer counts by in elastic runs."""
        return self.num_samples // self.per_step

    def remaining_steps(self, consumed: int) -> int:
        return (self.num_samples - consumed) // self.per_step

    def batches(self, epoch: int, consumed: int) -> list[np.ndarray]:
        """This rank's micro-batches for the rest of `epoch` after `consumed` samples."""
        rest = epoch_permutation(self.num_samples, self.seed, epoch)[consumed:]
        used = self.remaining_steps(consumed) * self.per_step
        mine = rest[:used][self.rank::self.world_size]
        return [mine[i:i + self.batch_size] for i in range(0, len(mine), self.batch_size)]

    def balanced_batches(self, epoch: int, consumed: int, batches: tuple) -> list[np.ndarray]:
        """This rank's micro-batches for the rest of `epoch` after `consumed` samples under a
        plan (training.balance: per-rank sizes summing to the global batch per pass). Each
        pass takes the next global batch of the permutation, as round-robin dealing does, cut
        at the plan's offsets (BalancedShards' rule): the steps consumed stay a prefix of the
        permutation, so a plan or a world may change at any step boundary."""
        total = self.batch_size * self.world_size
        if len(batches) != self.world_size or sum(batches) != total:
            raise ValueError(f"plan {batches} does not split {total} over {self.world_size} ranks")
        rest = epoch_permutation(self.num_samples, self.seed, epoch)[consumed:]
        used = self.remaining_steps(consumed) * self.per_step
        offset, size = sum(batches[:self.rank]), batches[self.rank]
        return [rest[start:start + size] for start in range(offset, used, total)]


def eval_indices(num_samples: int, world_size: int, rank: int) -> np.ndarray:
    return np.arange(rank, num_samples, world_size)


def eval_batches(num_samples: int, world_size: int, rank: int, batch_size: int) -> list[np.ndarray]:
    """This rank's validation batches, as many as every other rank's: training.zero=3 gathers
    the parameters inside each forward (a collective), so a rank one sample short whose samples
    fill whole batches splits its last one in two rather than skip the gathers the others join."""
    mine = eval_indices(num_samples, world_size, rank)
    batches = [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]
    most = -(-len(eval_indices(num_samples, world_size, 0)) // batch_size)  # rank 0 has the most samples
    if len(batches) < most and batches and len(batches[-1]) > 1:
        last = batches.pop()
        batches += [last[:-1], last[-1:]]
    return batches
