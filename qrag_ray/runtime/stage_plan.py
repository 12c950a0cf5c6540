"""What one Ray stage of a build asks for and where its kernels run, as the build's resource plan resolved
it (qrag_ray/index/resource_plan.py): the one value a stage reads its actors, CPUs, GPUs and batch from,
whichever layer runs it (the generation backends, the stream, the shard tasks). Pure, no Ray."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class StagePlan:
    """One stage: a pool of `min_size`..`max_size` actors (equal: a fixed pool, every actor started before
    the stage runs) or up to `max_size` tasks at once, each holding `num_cpus` and `num_gpus`."""

    name: str
    compute: Literal["actors", "tasks"]
    min_size: int
    max_size: int
    num_cpus: float
    num_gpus: float = 0.0
    device: Literal["cpu", "cuda"] = "cpu"  # where the kernels run; QRAG_KERNELS=cpu keeps the GPU requests
    batch_size: int | None = None  # rows per call
    in_flight: int | None = None  # per actor: requests in a vLLM engine, calls at once in an embedding actor
    tensor_parallel: int | None = None  # GPUs one vLLM engine spreads its model over
    threads: int | None = None  # kernel threads per actor or task (torch, FAISS's OpenMP)
    bundles: tuple[dict, ...] = ()  # a multi-process actor's Ray bundles (one per vLLM engine worker)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # a vLLM engine's resolved arguments
    notes: tuple[str, ...] = ()  # what the plan could not give as asked, said once at start

    @property
    def fixed(self) -> bool:
        return self.min_size == self.max_size

    def pool(self) -> dict[str, int]:
        """ray.data.ActorPoolStrategy's size arguments: a fixed size, or the autoscaling bounds."""
        return {"size": self.min_size} if self.fixed else {"min_size": self.min_size, "max_size": self.max_size}

    def line(self) -> str:
        """One line for the start of a build, e.g. `embed  actors 8 fixed  CPU 1  GPU 1  batch 4096  cuda`."""
        if self.compute == "actors":
            size = f"actors {self.min_size} fixed" if self.fixed else f"actors {self.min_size}-{self.max_size}"
        else:
            size = f"tasks {self.max_size} at once" if self.max_size > 1 else "task 1"
        parts = [f"{self.name:<12}", f"{size:<16}", f"CPU {_num(self.num_cpus)}"]
        if self.num_gpus:
            parts.append(f"GPU {_num(self.num_gpus)}" + (f" (tp {self.tensor_parallel})" if self.tensor_parallel
                                                          and self.tensor_parallel > 1 else ""))
        if self.batch_size:
            parts.append(f"batch {self.batch_size}")
        if self.in_flight:
            parts.append(f"in flight {self.in_flight}" + ("/engine" if self.name == "generate" else "/actor"))
        if self.threads:
            parts.append(f"threads {self.threads}")
        parts.append(self.device)
        return "  ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bundles"] = list(self.bundles)
        out["notes"] = list(self.notes)
        return out


def _num(value: float) -> str:
    return f"{value:g}"
