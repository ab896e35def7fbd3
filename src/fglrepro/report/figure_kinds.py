"""The figure kinds a study can ask for (``report.figures``) and the aggregate CSV each reads; a
module of its own so that ``fgl-report --help`` and the workflow's rules need not import matplotlib."""

#: figure kind -> the aggregate CSV it reads ("curves" or "metrics").
FIGURE_INPUTS = {"convergence": "curves", "loss": "curves", "bars": "metrics", "heatmap": "metrics",
                 "lines": "metrics", "communication": "metrics"}
