# What runs when the workflow starts and ends: the progress lines (progress.smk), the record of the active
# run, and the fork server of local runs (src/fglrepro/fork_server.py: training and partition jobs fork from
# a process that has imported torch once; each is still a job of its own).


FORK_SERVER = {}  # its process, once onstart has started it
#: rules whose jobs run fgl-train / fgl-partition: the server starts when one of them is to run
FORKED_RULES = {"train", "partition", "partition_stats_json"}


onstart:
    from fglrepro import fork_server
    from fglrepro.progress import record_active_run, start as start_progress, stored_costs

    record_active_run(os.getpid(), ["snakemake", *sys.argv[1:]])
    if config["fork_server"] and workflow.local_exec and any(
        job.rule.name in FORKED_RULES for job in workflow.dag.needrun_jobs()
    ):
        FORK_SERVER["process"] = fork_server.start(in_results("logs/fork_server.log"))
    start_progress(planned_runs(), parallel_jobs(), stored=stored_costs(Path(SNAPSHOT) / "runs.csv"))


onsuccess:
    from fglrepro import fork_server
    from fglrepro.progress import cancel_rescheduling_timers, clear_active_run, damaged_runs_message

    fork_server.stop(FORK_SERVER.get("process"))
    clear_active_run()
    cancel_rescheduling_timers()
    message = damaged_runs_message(in_results("logs/aggregate"), WORKFLOW_STARTED)
    if message:
        print(message, file=sys.stderr)


onerror:
    from fglrepro import fork_server
    from fglrepro.progress import cancel_rescheduling_timers, clear_active_run, stop_message, stopped_jobs

    fork_server.stop(FORK_SERVER.get("process"))
    clear_active_run()
    cancel_rescheduling_timers()
    message = stop_message(stopped_jobs(in_results("logs/train"), WORKFLOW_STARTED))
    if message:
        print(message, file=sys.stderr)
