"""PowerSGD for torch gradients: the tensor operations of hvdcls/maths/powersgd.py.

Mirror: tf_backend/compression.py. Replaces hvd.DistributedOptimizer's reduction: after the
backward passes, `reduce_(grads)` turns each rank's gradients into the ranks' (compressed)
average in place, with three grouped asynchronous Horovod all-reduces (the uncompressed
gradients, all Ps, all Qs) so that the uncompressed one travels while P and Q are computed.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from hvdcls.config import PowerSGDConfig
from hvdcls.horovod_backend import sleep_until_done
from hvdcls.maths import powersgd

# (tensors, name) -> a handle; handle -> the ranks' averages, in order.
Start = Callable[[list, str], object]
Wait = Callable[[object], list]


def horovod_exchange(asleep: bool = False) -> tuple[Start, Wait]:
    """Horovod's grouped all-reduce; `asleep` (horovod.wait=sleep): its wait naps between
    polls instead of Horovod's spin (hvdcls.horovod_backend.sleep_until_done)."""
    import horovod.torch as hvd

    def start(tensors: list, name: str):
        return hvd.grouped_allreduce_async(tensors, op=hvd.Average, name=name)  # Horovod

    def wait(handle) -> list:
        if asleep:
            sleep_until_done([handle], hvd.poll)  # Horovod
        return hvd.synchronize(handle)  # Horovod

    return start, wait


def local_exchange() -> tuple[Start, Wait]:
    """One process, no Horovod: the average of one rank is itself."""
    return (lambda tensors, name: tensors), (lambda handle: handle)


def skinny_product(factor: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """matrix @ factor for a (k x r) factor of a few columns, as (factor^T matrix^T)^T: the same
    product, but CPU BLAS runs the tall-skinny right operand 4-6x slower than the short-wide left
    one (a 512 x 4608 gradient times rank 4: 1.9 ms against 0.37 ms, one thread); contiguous,
    for the all-reduce."""
    return (factor.T @ matrix.T).T.contiguous()


def orthogonalise_(p: torch.Tensor) -> None:
    """Modified Gram-Schmidt over the columns, in place (as powersgd.orthogonalise)."""
    for i in range(p.shape[1]):
        column = p[:, i:i + 1]
        column /= torch.linalg.vector_norm(column) + powersgd.GRAM_SCHMIDT_EPS
        if i + 1 < p.shape[1]:
            rest = p[:, i + 1:]
            rest -= column @ (column.T @ rest)


class PowerSGDReducer:
    """Error feedback and warm-start Q per compressed gradient; `step` counts reductions."""

    def __init__(self, shapes: list[tuple], settings: PowerSGDConfig, device: torch.device,
                 exchange: Optional[tuple[Start, Wait]] = None):
        self.plans = powersgd.plan(shapes, settings.rank, settings.min_compression_rate,
                                   channels_last=False)
        self.start_iter, self.fp16 = settings.start_iter, settings.fp16
        self.start, self.wait = exchange or horovod_exchange()
        self.compressed = [i for i, p in enumerate(self.plans) if p.compressed]
        self.dense = [i for i, p in enumerate(self.plans) if not p.compressed]
        self.qs = {i: torch.from_numpy(powersgd.initial_q(self.plans[i].dims[1], self.plans[i].rank, i))
                   .to(device) for i in self.compressed}
        self.errors = {i: torch.zeros(self.plans[i].dims, device=device) for i in self.compressed}
        # M = G + E of each compressed gradient, kept from step to step: on CPU, fresh memory
        # for every intermediate of the step (M, P Q^T, M - P Q^T: about three models' worth of
        # new pages) cost more than the arithmetic on them
        self.ms = {i: torch.empty(self.plans[i].dims, device=device) for i in self.compressed}
        self.step = 0
        self.counter = powersgd.ByteCounter(powersgd.dense_bytes(shapes))

    def reduce_(self, grads: list[Optional[torch.Tensor]], scale: float = 1.0) -> None:
        """Average `grads` over ranks in place. `scale` is the loss scale the gradients carry
        (mixed precision): the error feedback is kept unscaled, so a new scale does not skew it.
        A None (a frozen parameter's, training.freeze_epochs) takes no part, and its error
        feedback and warm start wait as they are."""
        live = [i for i, g in enumerate(grads) if g is not None]
        if self.step < self.start_iter:  # warm-up: the plain average of everything
            self.counter.add(self._average_(grads, live, "powersgd.warmup"))
        else:
            dense = [i for i in self.dense if grads[i] is not None]
            handle, sent = self._start(grads, dense, "powersgd.dense")
            sent += self._compress_(grads, [i for i in self.compressed if grads[i] is not None], scale)
            self._finish_(grads, dense, handle)
            self.counter.add(sent)
        self.step += 1

    def _start(self, grads, indices, name):
        tensors = [grads[i].reshape(-1) for i in indices]
        return self.start(tensors, name) if tensors else None, sum(t.numel() * t.element_size() for t in tensors)

    def _finish_(self, grads, indices, handle) -> None:
        if handle is not None:
            for i, value in zip(indices, self.wait(handle)):
                grads[i].copy_(value.view_as(grads[i]))

    def _average_(self, grads, indices, name) -> int:
        handle, sent = self._start(grads, list(indices), name)
        self._finish_(grads, list(indices), handle)
        return sent

    def _compress_(self, grads: list, indices: list[int], scale: float) -> int:
        """grads[i] <- the ranks' rank-r approximation of each compressed gradient i in `indices`."""
        if not indices:
            return 0
        ms = [torch.add(grads[i].reshape(self.plans[i].dims), self.errors[i], alpha=scale, out=self.ms[i])
              for i in indices]
        ps, sent_p = self._allreduce([skinny_product(self.qs[i], m) for m, i in zip(ms, indices)],
                                     "powersgd.p")
        for p in ps:
            orthogonalise_(p)
        qs, sent_q = self._allreduce([skinny_product(p, m.T) for m, p in zip(ms, ps)], "powersgd.q")
        for i, m, p, q in zip(indices, ms, ps, qs):
            approx = self._write_approximation(grads[i], p, q)
            # An overflowed fp16 step is skipped: keep the error and the warm start, or a NaN Q
            # would make every later step NaN too. P Q^T is finite when P and Q are (float32
            # does not overflow on their products), and an inf or NaN in any rank's M reaches
            # both through the all-reduces: checking them reads no model-sized tensor.
            if torch.isfinite(p).all() and torch.isfinite(q).all():
                self.qs[i] = q
                torch.sub(m, approx, out=self.errors[i])
                if scale != 1.0:
                    self.errors[i].div_(scale)
        return sent_p + sent_q

    def _write_approximation(self, grad: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """grad <- P Q^T (the ranks' compressed average) and that matrix: written in place where
        the gradient is contiguous, as it is on CPU."""
        if grad.is_contiguous():
            return torch.matmul(p, q.T, out=grad.view(p.shape[0], q.shape[0]))
        approx = p @ q.T
        grad.copy_(approx.view_as(grad))
        return approx

    def _allreduce(self, tensors: list[torch.Tensor], name: str) -> tuple[list, int]:
        """The ranks' averages (float32), sent in float16 when so configured; and bytes sent."""
        sent = [t.half() for t in tensors] if self.fp16 else tensors
        averaged = [t.float() for t in self.wait(self.start(sent, name))]
        return averaged, sum(t.numel() * t.element_size() for t in sent)

    def average_errors_(self) -> None:
        """Every rank's error <- the ranks' mean error: what a checkpoint keeps. Training does
        not change (only the mean error enters the averaged M)."""
        if self.compressed:
            errors = self.wait(self.start([self.errors[i] for i in self.compressed], "powersgd.errors"))
            self.errors.update(zip(self.compressed, errors))

    def state_dict(self) -> dict:
        return {"step": self.step, "qs": [self.qs[i] for i in self.compressed],
                "errors": [self.errors[i] for i in self.compressed]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["qs"]) != len(self.compressed):
            raise ValueError(f"PowerSGD state for {len(state['qs'])} compressed tensors, "
                             f"the model has {len(self.compressed)}")
        self.step = int(state["step"])
        for i, q, error in zip(self.compressed, state["qs"], state["errors"]):
            self.qs[i], self.errors[i] = q.clone(), error.clone()

    def state_tensors(self) -> list[torch.Tensor]:
        """Q and error tensors, for Horovod's broadcast and averaging."""
        return [self.qs[i] for i in self.compressed] + [self.errors[i] for i in self.compressed]
