"""``fgl-partition``: split a prepared graph into clients; describe a partition.

    fgl-partition build --data data/prepared/Cora/plain.pt \
        --spec '{"partitioner": "louvain", "options": {}, "split": {...}}' --clients 10 --seed 0 --out part.pt
    fgl-partition stats --data data/prepared/Cora/plain.pt --partition part.pt --out part.stats.json
"""

from __future__ import annotations

import argparse
import json
import logging

from fglrepro.cli.common import run_cli, subcommand_parser

log = logging.getLogger("fgl-partition")


def parse_args(argv=None) -> argparse.Namespace:
    parser, sub, example = subcommand_parser("fgl-partition", __doc__)

    build = sub.add_parser("build", help="partition a prepared graph and split every client", **example("build"))
    build.add_argument("--data", required=True, help="prepared graph (.pt)")
    build.add_argument("--spec", required=True,
                       help="partition spec as JSON (a study's partition block): partitioner (an unknown name's error "
                            "lists the valid ones), options (the partitioner's), split ({mode: stratified|random|file, "
                            "train, val}), graphless_ratio")
    build.add_argument("--clients", type=int, required=True, help="number of clients")
    build.add_argument("--seed", type=int, required=True, help="seed of the partitioner and the split")
    build.add_argument("--out", required=True, help="partition (.pt)")
    stats = sub.add_parser("stats", help="per-client statistics of a partition (JSON)", **example("stats"))
    stats.add_argument("--data", required=True, help="prepared graph (.pt)")
    stats.add_argument("--partition", required=True, help="partition (.pt)")
    stats.add_argument("--out", required=True, help="statistics JSON")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        from fglrepro.data.graph import load_graph
        from fglrepro.io import atomic_write_json
        from fglrepro.partition.build import PartitionSpec, build_partition
        from fglrepro.partition.data import Partition

        data = load_graph(args.data)
        if args.command == "build":
            spec = PartitionSpec.from_dict(json.loads(args.spec))
            partition = build_partition(data, spec, args.clients, args.seed)
            partition.save(args.out)
            sizes = [n.numel() for n in partition.client_nodes]
            log.info("%d clients of %d to %d nodes, %d graphless", partition.num_clients, min(sizes),
                     max(sizes), int(partition.graphless.sum()))
            return
        from fglrepro.partition.stats import partition_stats

        stats = partition_stats(data, Partition.load(args.partition))
        atomic_write_json(stats, args.out)
        avg = stats["average"]
        log.info("%.1f nodes, %.1f edges, clustering %.3f per client; heterogeneity %.3f",
                 avg["nodes"], avg["edges"], avg["clustering"], stats["heterogeneity"])

    run_cli(body)


if __name__ == "__main__":
    main()
