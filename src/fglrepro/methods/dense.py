"""DENSE (Zhang et al., NeurIPS 2022): data-free one-shot FL by ensemble distillation,
adapted to node classification as O-pFGL (2025) adapts it.

Clients train their own models (any architecture) and upload them once. The server
trains a class-conditional generator of node features whose kNN pseudo graph (FedTAD's,
shared in :mod:`fglrepro.fl.generator`) the ensemble of uploaded models classifies as the
requested labels, while an adversarial term seeks nodes where student and ensemble
disagree; the student is distilled from the ensemble on those pseudo graphs. Clients
receive the student (the "+ft" rows wrap this method in ``finetune``).

Departures from the image-classification original, forced by graphs or chosen for CPU
cost, are named in :class:`DENSEHparams`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError, choice
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.generator import balanced_labels, diversity_loss, knn_pseudo_graph, seeded_generator
from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.fl.training import make_optimizer, train_epochs
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
    temperature: float = 20.0
    lambda_ce: float = 1.0
    lambda_adv: float = 1.0
    lambda_div: float = 0.0

    def __post_init__(self) -> None:
        choice(self.student, STUDENTS, "hparams.student")
        if self.num_pseudo_nodes < 1 or self.knn < 1 or self.distill_epochs < 0:
            raise ConfigError(
                f"hparams.num_pseudo_nodes and knn must be >= 1 and distill_epochs >= 0; got "
                f"{self.num_pseudo_nodes}, {self.knn}, {self.distill_epochs}"
            )


def distillation_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """``T² KL(softmax(teacher/T) ‖ softmax(student/T))`` averaged over nodes; ``[B, C]`` each."""
    log_s = F.log_softmax(student_logits / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * temperature**2


def boundary_adversarial_loss(student_logits: Tensor, ensemble_logits: Tensor) -> Tensor:
    """DENSE's adversarial term: ``-mean_i 1[argmax D_i = argmax S_i] KL(D_i ‖ S_i)``
    (minimising it moves generated nodes towards the student's decision boundary)."""
    agree = (student_logits.argmax(-1) == ensemble_logits.argmax(-1)).float()
    kl = F.kl_div(F.log_softmax(student_logits, -1), F.log_softmax(ensemble_logits, -1),
                  reduction="none", log_target=True).sum(-1)
    return -(agree * kl).mean()


@register("dense")
class DENSE(FederatedMethod):
    """Local training, one upload, server-side ensemble distillation into the student(s).

    Subclasses change the ensemble (:meth:`ensemble_weights`) and the distillation data
    (:meth:`distillation_batch`); see Co-Boost.
    """

    label = "DENSE"
    Hparams = DENSEHparams
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: DENSEHparams) -> None:
        super().__init__(federation, hparams)
        self.models = [federation.client_model(k) for k in range(len(self.clients))]
        self.optimizers = [make_optimizer(m, federation.train) for m in self.models]
        self.rng = torch.Generator().manual_seed(federation.generator.initial_seed() + 2)
        self.device = self.clients[0].x.device
        self.num_classes = self.clients[0].num_classes
        self.pseudo_labels = balanced_labels(hparams.num_pseudo_nodes, self.num_classes, self.device)
        self.global_student: nn.Module | None = None
        self.personal: dict[int, nn.Module] = {}

    def client_update(self, k: int, round_: int) -> Upload:
        model = self.models[k]
        loss = train_epochs(model, self.optimizers[k], self.clients[k], self.federation.train.local_epochs)
        return Upload(tensors=parameters_of(model), weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        teachers = [self.teacher_model(k, u).eval().requires_grad_(False) for k, u in uploads.items()]
        if self.hparams.student == "global":
            self.global_student = copy.deepcopy(self.federation.model)
            self.distill([self.global_student], teachers)
        else:
            self.personal = {k: self.teacher_model(k, u) for k, u in uploads.items()}
            self.distill(list(self.personal.values()), teachers)

    def received_model(self, k: int) -> nn.Module | None:
        return self.global_student if self.hparams.student == "global" else self.personal.get(k)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        received = self.received_model(k)
        return received if stage == "global" and received is not None else self.models[k]

    def server_models(self) -> list[nn.Module]:
        if self.hparams.student == "global":
            return [self.global_student] if self.global_student is not None else []
        return list(self.personal.values())

    def download_bytes(self, k: int) -> int:
        model = self.received_model(k)
        return 0 if model is None else sum(p.numel() * p.element_size() for p in model.parameters())

    def ensemble_weights(self, num_teachers: int) -> Tensor:
        """``[K]`` weights of the teachers' logits in the ensemble (DENSE: the mean)."""
        return torch.full((num_teachers,), 1.0 / num_teachers, device=self.device)

    def ensemble(self, teachers: list[nn.Module], x: Tensor, adj: Tensor) -> Tensor:
        """``[B, C]`` weighted sum of the teachers' logits on the graph ``(x [B, F], adj)``."""
        logits = torch.stack([t(x, adj) for t in teachers])
        return torch.einsum("k,kbc->bc", self.ensemble_weights(len(teachers)), logits)

    def distillation_batch(self, students: list[nn.Module], teachers: list[nn.Module], x: Tensor, adj: Tensor
                           ) -> tuple[Tensor, Tensor]:
        """The nodes ``[B', F]`` and graph the students are distilled on this epoch, from the
        epoch's generated nodes ``x [B, F]`` and their kNN graph (DENSE: those)."""
        return x, adj

    def distill(self, students: list[nn.Module], teachers: list[nn.Module]) -> None:
        """``distill_epochs`` of generator steps then student steps, in place. One generator
        serves all students: its adversarial term is their mean."""
        hp = self.hparams
        generator = seeded_generator(
            self.num_classes, self.clients[0].x.size(1), hp.noise_dim, self.rng, self.device
        )
        gen_opt = torch.optim.Adam(generator.parameters(), lr=hp.lr_generator)
        student_opts = [torch.optim.SGD(s.parameters(), lr=hp.lr_student, momentum=hp.momentum)
                        for s in students]
        labels = self.pseudo_labels
        for _ in range(hp.distill_epochs):
            z = torch.randn(labels.numel(), hp.noise_dim, generator=self.rng).to(self.device)
            for student in students:
                student.eval().requires_grad_(False)
            generator.train()
            for _ in range(hp.generator_steps):
                gen_opt.zero_grad(set_to_none=True)
                x = generator(z, labels)
                adj = knn_pseudo_graph(x.detach(), hp.knn)
                ens = self.ensemble(teachers, x, adj)
                adversarial = torch.stack([boundary_adversarial_loss(s(x, adj), ens) for s in students]).mean()
                loss = hp.lambda_ce * F.cross_entropy(ens, labels) + hp.lambda_adv * adversarial
                if hp.lambda_div > 0:
                    loss = loss + hp.lambda_div * diversity_loss("noise_l1", z, x)
                loss.backward()
                gen_opt.step()
            with torch.no_grad():
                x = generator(z, labels)
                adj = knn_pseudo_graph(x, hp.knn)
            x, adj = self.distillation_batch(students, teachers, x, adj)
            with torch.no_grad():
                target = self.ensemble(teachers, x, adj)
            for student, opt in zip(students, student_opts):
                student.train().requires_grad_(True)
                for _ in range(hp.distill_steps):
                    opt.zero_grad(set_to_none=True)
                    distillation_kl(student(x, adj), target, hp.temperature).backward()
                    opt.step()
                student.eval()
