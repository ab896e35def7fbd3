# Progress and an estimate of the time left, printed every minute while the workflow runs
# (src/fglrepro/progress.py): training runs done of those this run makes, CPU so far, and the
# time left from the measured cost of finished runs of the same method (or of the same run in the snapshot).


import time


def planned_runs():
    """``(run JSON path, method)`` of every training job Snakemake will run (its DAG: the targets
    asked for, and outdated runs it redoes)."""
    return [(job.output[0], run_entry(job.wildcards.study, job.wildcards.run)["method"])
            for job in workflow.dag.needrun_jobs() if job.rule.name == "train"]


def parallel_jobs():
    """How many jobs run at once: --cores locally, --jobs on a cluster."""
    limits = [v for v in (workflow.resource_settings.cores, workflow.resource_settings.nodes) if v]
    return min(limits, default=1)


# When the run stops (Ctrl-C, SIGTERM, a failed job), the onerror hook (hooks.smk) says which training jobs a
# signal stopped and how to resume, below Snakemake's own "Error in rule train" lines; the onstart hook notes
# the running workflow's pid, so that a second run started here meanwhile is told (below) the first is still
# active before it reaches "--unlock".
WORKFLOW_STARTED = time.time()

if workflow.is_main_process and not workflow.dryrun:
    from fglrepro.progress import lock_hint

    _hint = lock_hint()
    if _hint:
        print(_hint, file=sys.stderr)
