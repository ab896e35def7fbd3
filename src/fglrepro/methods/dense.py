"""DENSE (Zhang et al., NeurIPS 2022): data-free one-shot FL by ensemble distillation,
adapted to node classification as O-pFGL (2025) adapts it.

Clients train their own models (any architecture) and upload them once. The server
trains a class-conditional generator of node features whose kNN pseudo graph (FedTAD's,
shared in :mod:`fglrepro.components.generator`) the ensemble of uploaded models classifies as the
requested labels, while an adversarial term seeks nodes where student and ensemble
disagree; the student is distilled from the ensemble on those pseudo graphs. Clients
receive the student (the "+ft" rows wrap this method in ``finetune``).

Departures from the image-classification original, forced by graphs or chosen for CPU
cost, are named in :class:`DENSEHparams`.

Fast path (``train.engine`` not ``sequential``): the teachers run as one stacked pass
(:class:`~fglrepro.components.generator.Teachers`), the pseudo graphs are dense operators when every
model is a GCN, and the generator's and students' optimisers are torch's fused kernels
(:class:`~fglrepro.fl.kernel_optimizer.KernelOptimizer`). The epochs, and the generator and
student steps inside them, stay a sequence: each step starts from the generator and students
the previous one left, so they cannot be batched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.generator import (
    Teachers,
    balanced_labels,
    dense_graph_fits,
    distill_students,
    diversity_loss,
    knn_pseudo_graph,
    seeded_generator,
    uploaded_teachers,
)
from fglrepro.config import ConfigError, choice
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.methods import register

STUDENTS = ("global", "personal")


@dataclass(frozen=True)
class DENSEHparams:
    """DENSE settings.

    student: ``global``: one fresh model of the study's ``model`` (DENSE) that every client
        receives; ``personal``: each client's uploaded model is distilled from the ensemble
        and sent back to it (heterogeneous clients, O-pFGL Tables 11-12).
    num_pseudo_nodes, knn: generated nodes per epoch (classes balanced) and k of their
        kNN graph (FedTAD's pseudo graph, as O-pFGL adapts DENSE).
    noise_dim: size of the generator's noise. DENSE's generator maps noise alone to an
        image and pairs it with random labels; the shared class-conditional generator is
        used here.
    distill_epochs, generator_steps, distill_steps: epochs; generator and student steps
        per epoch (DENSE: 200 epochs, 30 generator steps, a pass over a memory bank of all
        earlier batches; here the current batch only and fewer steps, for CPU cost).
    lr_generator: Adam of the generator (DENSE 1e-3).
    lr_student, momentum: SGD of the student (DENSE 0.01 / 0.9).
    student_clip: each student step's gradient is clipped to this L2 norm (0: not clipped).
        Not in DENSE, whose image students have BatchNorm layers; GNN students without them,
        distilled at T = 20 on generated features, diverged without it (their logits reached
        inf in 21 of 176 O-pFGL-study runs, and others ended near chance level). 5: of 1, 5 and
        20, the best validation accuracy of the distilled student before fine-tuning (O-pFGL
        Table 1, seed 0, DENSE on Cora and Co-Boost on CiteSeer; docs/notes/opfgl.md).
    temperature: T of the distillation KL (DENSE 20).
    lambda_ce, lambda_adv, lambda_div: weights of the generator's cross-entropy to the
        requested labels, of the boundary adversarial term (KL on nodes where ensemble and
        student agree, maximised) and of the shared diversity loss (0: DENSE has none; its
        BatchNorm-statistics term has no counterpart in a GCN without BatchNorm).
    """

    student: str = "global"
    num_pseudo_nodes: int = 100
    knn: int = 5
    noise_dim: int = 32
    distill_epochs: int = 100
    generator_steps: int = 5
    distill_steps: int = 5
    lr_generator: float = 1e-3
    lr_student: float = 0.01
    momentum: float = 0.9
    student_clip: float = 5.0
    temperature: float = 20.0
    lambda_ce: float = 1.0
    lambda_adv: float = 1.0
    lambda_div: float = 0.0

    def __post_init__(self) -> None:
        choice(self.student, STUDENTS, "hparams.student")
        if self.student_clip < 0:
            raise ConfigError(f"hparams.student_clip must be >= 0 (0: no clipping), got {self.student_clip}")
        if self.num_pseudo_nodes < 1 or self.knn < 1 or self.distill_epochs < 0:
            raise ConfigError(
                f"hparams.num_pseudo_nodes and knn must be >= 1 and distill_epochs >= 0; got "
                f"{self.num_pseudo_nodes}, {self.knn}, {self.distill_epochs}"
            )


def boundary_adversarial_loss(student_logits: Tensor, ensemble_logits: Tensor) -> Tensor:
    """DENSE's adversarial term: ``-mean_i 1[argmax D_i = argmax S_i] KL(D_i ‖ S_i)``
    (minimising it moves generated nodes towards the student's decision boundary)."""
    agree = (student_logits.argmax(-1) == ensemble_logits.argmax(-1)).float()
    return -(agree * kl_divergence(ensemble_logits, student_logits, reduction="none").sum(-1)).mean()


@register("dense")
class DENSE(FederatedMethod):
    """Local training, one upload, server-side ensemble distillation into the student(s).

    Subclasses change the ensemble (:meth:`ensemble_weights`) and the distillation data
    (:meth:`distillation_batch`); see Co-Boost.
    """

    label = "DENSE"
    Hparams = DENSEHparams
    heterogeneous_models = True
    has_server_models = True
    vectorised = True

    def __init__(self, federation: Federation, hparams: DENSEHparams) -> None:
        super().__init__(federation, hparams)
        self.rng = torch.Generator().manual_seed(federation.generator.initial_seed() + 2)
        self.device = self.clients[0].x.device
        self.num_classes = self.clients[0].num_classes
        self.pseudo_labels = balanced_labels(hparams.num_pseudo_nodes, self.num_classes, self.device)
        #: the models distilled in the last server step (what clients receive)
        self.students: list[nn.Module] = []
        #: whether this server step's pseudo graphs are dense operators (fast path, GCNs only)
        self.dense_graph = False

    @property
    def fast(self) -> bool:
        """Whether the fast path runs (``train.engine`` is not ``sequential``)."""
        return self.federation.train.engine != "sequential"

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        teachers = uploaded_teachers(self, uploads, training=False, batched=self.fast)
        if self.hparams.student == "global":
            self.students = [copy.deepcopy(self.federation.model)]
            for state in self.states:
                state.received = self.students[0]
        else:
            self.students = []
            for k, u in uploads.items():
                self.states[k].received = self.teacher_model(k, u)
                self.students.append(self.states[k].received)
        self.distill(self.students, teachers)

    def server_models(self) -> list[nn.Module]:
        return list(self.students)

    def ensemble_weights(self, num_teachers: int) -> Tensor:
        """``[K]`` weights of the teachers' logits in the ensemble (DENSE: the mean)."""
        return torch.full((num_teachers,), 1.0 / num_teachers, device=self.device)

    def ensemble(self, teachers: Teachers, x: Tensor, adj: Tensor) -> Tensor:
        """``[B, C]`` weighted sum of the teachers' logits on the graph ``(x [B, F], adj)``."""
        return torch.einsum("k,kbc->bc", self.ensemble_weights(len(teachers)), teachers(x, adj))

    def distillation_batch(self, students: list[nn.Module], teachers: Teachers, x: Tensor, adj: Tensor
                           ) -> tuple[Tensor, Tensor]:
        """The nodes ``[B', F]`` and graph the students are distilled on this epoch, from the
        epoch's generated nodes ``x [B, F]`` and their kNN graph (DENSE: those)."""
        return x, adj

    def distill(self, students: list[nn.Module], teachers: Teachers) -> None:
        """``distill_epochs`` of generator steps then student steps, in place. One generator
        serves all students: its adversarial term is their mean."""
        hp = self.hparams
        generator = seeded_generator(
            self.num_classes, self.clients[0].x.size(1), hp.noise_dim, self.rng, self.device
        )
        fused = self.fast or None
        gen_opt = KernelOptimizer(generator.parameters(), lr=hp.lr_generator, fused=fused)
        student_opts = [KernelOptimizer(s.parameters(), lr=hp.lr_student, momentum=hp.momentum, fused=fused)
                        for s in students]
        labels = self.pseudo_labels
        self.dense_graph = self.fast and dense_graph_fits(teachers, students)

        def draw_batch() -> tuple[Tensor, Tensor]:
            z = torch.randn(labels.numel(), hp.noise_dim, generator=self.rng).to(self.device)
            for student in students:
                student.eval().requires_grad_(False)
            generator.train()
            for _ in range(hp.generator_steps):
                gen_opt.zero_grad(set_to_none=True)
                x = generator(z, labels)
                adj = knn_pseudo_graph(x.detach(), hp.knn, self.dense_graph)
                ens = self.ensemble(teachers, x, adj)
                adversarial = torch.stack([boundary_adversarial_loss(s(x, adj), ens) for s in students]).mean()
                loss = hp.lambda_ce * F.cross_entropy(ens, labels) + hp.lambda_adv * adversarial
                if hp.lambda_div > 0:
                    loss = loss + hp.lambda_div * diversity_loss("noise_l1", z, x)
                loss.backward()
                gen_opt.step()
            with torch.no_grad():
                x = generator(z, labels)
                adj = knn_pseudo_graph(x, hp.knn, self.dense_graph)
            return self.distillation_batch(students, teachers, x, adj)

        distill_students(
            students, student_opts, hp.distill_epochs, hp.distill_steps, draw_batch,
            targets=lambda x, adj: self.ensemble(teachers, x, adj),
            student_loss=lambda logits, target: kl_divergence(target, logits, hp.temperature) * hp.temperature**2,
            clip_norm=hp.student_clip,
        )
