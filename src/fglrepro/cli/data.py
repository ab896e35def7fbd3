r"""``fgl-data``: fetch verified raw files, and write the canonical prepared graph.

    fgl-data download --dataset Photo --root data/raw --mirror resources/datasets --mirror ../shared/datasets \
        --out data/raw/Photo/download.json
    fgl-data prepare --dataset Cora --root data/raw --record data/raw/Cora/download.json \
        [--largest-component] [--normalize-features] --out data/prepared/Cora/plain.pt
"""

from __future__ import annotations

import argparse
import logging

from fglrepro.cli.common import run_cli, subcommand_parser

log = logging.getLogger("fgl-data")


def parse_args(argv=None) -> argparse.Namespace:
    from fglrepro.data.registry import DATASETS

    parser, sub, example = subcommand_parser("fgl-data", __doc__)

    datasets = f"one of {', '.join(sorted(DATASETS))}"
    download = sub.add_parser("download", help="place verified raw files in the loader's layout", **example("download"))
    download.add_argument("--dataset", required=True, metavar="NAME", help=datasets)
    download.add_argument("--root", required=True, help="raw root directory of the loaders")
    download.add_argument("--mirror", action="append", default=None,
                          help="mirror root (subfolders planetoid/, amazon/, coauthor/, actor/, ...) or folder of raw "
                               "files; repeat for several, searched in order")
    download.add_argument("--out", required=True, help="JSON record of the verified files")
    prepare = sub.add_parser("prepare", help="write the canonical graph of a dataset", **example("prepare"))
    prepare.add_argument("--dataset", required=True, metavar="NAME", help=datasets)
    prepare.add_argument("--root", required=True, help="raw root directory (as for download)")
    prepare.add_argument("--record", help="download record (download.json) whose digests the raw files must match")
    prepare.add_argument("--largest-component", action="store_true", help="keep the largest connected component")
    prepare.add_argument("--normalize-features", action="store_true", help="row-normalise the node features")
    prepare.add_argument("--out", required=True, help="prepared graph (.pt)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)

    def body() -> None:
        from fglrepro.data.registry import get_dataset
        from fglrepro.io import atomic_write_json

        spec = get_dataset(args.dataset)
        if args.command == "download":
            from fglrepro.data.download import fetch_raw

            record = fetch_raw(spec, args.root, args.mirror)
            atomic_write_json(record, args.out)
            log.info("%s: %d raw files verified (%s)", spec.name, len(record["files"]), record["source"])
        else:
            from fglrepro.data.download import verify_recorded
            from fglrepro.data.graph import save_graph
            from fglrepro.data.prepare import prepare_graph

            if args.record:
                verify_recorded(spec, args.root, args.record)
            data = prepare_graph(spec, args.root, args.largest_component, args.normalize_features)
            save_graph(data, args.out)
            log.info("%s: %d nodes, %d directed edges, %d classes", spec.name, data.num_nodes,
                     data.edge_index.size(1), data.num_classes)

    run_cli(body)


if __name__ == "__main__":
    main()
