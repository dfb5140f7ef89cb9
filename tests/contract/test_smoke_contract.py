import jobrun


async def test_start_then_drive_to_done(store, clock):
    registry = jobrun.JobRegistry()

    @registry.job("crm", "walk")
    async def walk(p: jobrun.JobPass) -> jobrun.PassResult:
        value = await p.step("one", lambda: 41)
        p.count("items")
        return jobrun.PassResult(cursor=value + 1, done=True)

    run = await jobrun.start_job_run(store, module_id="crm", job="walk", clock=clock)
    report = await jobrun.run_due_jobs(store, registry, clock=clock)
    assert (report.attempted, report.completed) == (1, 1)
    record = await jobrun.get_job_run(store, run.id)
    assert record is not None
    assert record.status == "done"
    assert record.cursor == 42
    assert record.counters == {"items": 1}
