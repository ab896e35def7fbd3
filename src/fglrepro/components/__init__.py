"""Building blocks shared by a family of methods (not the framework: :mod:`fglrepro.fl` never
imports them). A part used by one method only lives in that method's package instead
(``fglrepro.methods.<name>/``).

- :mod:`~fglrepro.components.class_statistics`: class-wise feature statistics and their pooling
  (O-pFGL; through the surrogate graph also FedGM and FedGKD).
- :mod:`~fglrepro.components.control_variates`: control-variate bookkeeping (SCAFFOLD, FedDC).
- :mod:`~fglrepro.components.generator`: data-free generator distillation (FedTAD, DENSE,
  Co-Boost, GHOST; FedGKD's graph distillation).
- :mod:`~fglrepro.components.graph_learning`: kNN graphs and graph learning for graphless
  clients (FedGLS, kNN-graph baselines).
- :mod:`~fglrepro.components.heterogeneous`: what model-heterogeneous methods ask of the
  client zoo (LG-FedAvg, FedTGP, FedPPN).
- :mod:`~fglrepro.components.partial`: averaging of a subset of the parameters (FedPer, FedStar).
- :mod:`~fglrepro.components.prototypes`: class prototypes (FedProto, FedTGP, FedPPN).
- :mod:`~fglrepro.components.surrogate_graph`: a surrogate graph condensed from class
  statistics (O-pFGL, FedGM, FedGKD's graph distillation).
- :mod:`~fglrepro.components.topology`: structural node descriptors (FedStar, FedTAD).
"""
