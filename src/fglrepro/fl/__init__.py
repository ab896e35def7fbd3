"""The framework every method runs on: the contract, the round loop and what they share.

- :mod:`~fglrepro.fl.method`: the contract between a method and the round loop.
- :mod:`~fglrepro.fl.loop`, :mod:`~fglrepro.fl.checkpoint`: the round loop and resumable runs.
- :mod:`~fglrepro.fl.clients`, :mod:`~fglrepro.fl.augment`: client subgraphs and perturbed views of them.
- :mod:`~fglrepro.fl.training`, :mod:`~fglrepro.fl.kernel_optimizer`, :mod:`~fglrepro.fl.losses`:
  local training, its optimisers and shared loss terms.
- :mod:`~fglrepro.fl.engine`, :mod:`~fglrepro.fl.grouped`, :mod:`~fglrepro.fl.buffers`: the
  vectorised engine (homogeneous clients), grouped heterogeneous clients, reusable buffers.
- :mod:`~fglrepro.fl.aggregation`, :mod:`~fglrepro.fl.communication`: averaging and its bytes.
- :mod:`~fglrepro.fl.evaluation`: testing the clients' models each round.
- :mod:`~fglrepro.fl.wrapper`: methods that run around a base method.

Building blocks shared by several methods are in :mod:`fglrepro.components`; a method's own
parts are in its package under :mod:`fglrepro.methods`.
"""
