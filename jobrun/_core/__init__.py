"""The pure core, and its face: the rest of jobrun imports the core through here.

Nothing in the core touches a database or the network, and nothing reads a real
source on its own (the clock, entropy, ids, ``/proc``, the process id): the
public operations (``jobrun._api``) choose them once and hand them in as a
:class:`~jobrun._core.sources.Sources`. import-linter holds that line, indirect
imports included, and the order of the wings below (each imports only those
above it):

- ``model``: the records of a run and their stored encodings;
- ``time``: clocks, the database-aligned clock, wall-clock steps;
- ``limits``: rate and concurrency limits, the token bucket;
- ``leases``: claims and takeovers, renewal, fencing, holders and the proof of death;
- ``rules``: transitions, retry, fair turns, versions, schedules;
- ``port`` (the store's contract) and ``sources`` (what is handed in);
- ``engine``: registry, passes, steps, outcomes, the drive;
- ``operator``: starts, reads and actions of callers and operators.

Inside the core, modules import each other by their full path; outside it, only
through this face (a test reaches a module directly).
"""

from jobrun._core.engine import drive
from jobrun._core.engine.drive import drive_due_jobs
from jobrun._core.engine.observe import (
    LOG_PASSES,
    LoggingObserver,
    PassEnd,
    PassObserver,
    PassStart,
    PassWatch,
    StepEnd,
    observe_all,
)
from jobrun._core.engine.options import DriveKeywords, DriveOptions, drive_options
from jobrun._core.engine.passes import KEEP_CURSOR, JobPass, PassResult
from jobrun._core.engine.registry import JobRegistry
from jobrun._core.leases import proof_of_death
from jobrun._core.leases.claims import (
    CLAIM_FIELDS,
    Claimed,
    PreviousHolder,
    claim_candidate,
    claim_transition,
    is_orphan,
    takeover_note_parts,
)
from jobrun._core.leases.holders import (
    PRESENCE_PATTERN,
    HolderIdentity,
    Host,
    Liveness,
    liveness_seen_from,
    parse_holder,
)
from jobrun._core.leases.owed_releases import OwedReleases
from jobrun._core.leases.proof_of_death import (
    PRESENCE_CHECK_INTERVAL_S,
    PRESENCE_CHECK_TIMEOUT_S,
    PRESENCE_GRACE_S,
    OrphanScans,
)
from jobrun._core.limits.buckets import (
    MILLI,
    LimitUsage,
    bucket_cap_milli,
    bucket_state,
    limit_paused_reason,
    paused_limit_of,
    take,
    wait_for_token_s,
)
from jobrun._core.model.error_groups import group_errors
from jobrun._core.model.formats import format_instant, parse_instant
from jobrun._core.model.ids import UlidMint, first_id_at
from jobrun._core.model.predicates import (
    CANCELLED,
    FAILED,
    PARKED_AT,
    PAUSED,
    RUNNING,
    STRANDED,
    boot_held,
    due_at,
    is_cancelled,
    is_due,
    is_failed_since,
    is_leased,
    is_live,
    is_paused,
    is_prunable,
    is_stranded,
    live_run_of,
    parked,
    refill_on_resume,
    slot_counts,
    starts_later_at,
    stored_version,
    waiting_since,
)
from jobrun._core.model.progress import Poll, progress_of, span
from jobrun._core.model.queue_safety import DEFAULT_MAX_PAYLOAD_BYTES, assert_queue_safe
from jobrun._core.model.records import (
    DEFAULT_INSTANCE,
    JOB_RUN_LIST_MAX,
    BootInstant,
    BootLease,
    ClaimRequest,
    DriveError,
    HealthCounts,
    HeldLease,
    JobDriveReport,
    JobRun,
    JobRunHealth,
    JobRunStatus,
    PauseRecord,
    RateLimitBucket,
    RunFilter,
    RunKey,
    RunPatch,
    RunRow,
    ScheduleRow,
    StepRow,
    job_run_list_limit,
)
from jobrun._core.model.refusals import (
    checked_count,
    checked_seconds,
    is_int,
    is_number,
    refuse,
    refuse_type,
    type_name,
)
from jobrun._core.model.run_views import job_run_of
from jobrun._core.model.worker_rows import Job, WorkerRow, jobs_text
from jobrun._core.operator import actions, pausing, runs, scheduled_runs, starts
from jobrun._core.operator.actions import release_job_lease
from jobrun._core.operator.activity import (
    PER_MINUTE,
    RESOLUTIONS,
    ActivityQuery,
    Bucket,
    Counts,
    Resolution,
    activity_query,
    buckets_of,
    count_activity,
)
from jobrun._core.operator.browse import COUNT_CAP, BrowsableStore, JobLoad, RunQuery, run_matches
from jobrun._core.operator.retention import check_prune_after, prune_by_retention, retains
from jobrun._core.operator.runs import get_job_run, job_runs
from jobrun._core.operator.starts import JobStart, check_start
from jobrun._core.operator.waiting import Waiting, waiting_of
from jobrun._core.operator.worker_registry import (
    DEFAULT_HEARTBEAT_S,
    DUE_KINDS,
    GONE_AFTER_BEATS,
    beat_row,
    heartbeat_for,
    served_jobs,
    sweep_due,
    unserved,
    waits_for_no_one,
    worker_is_live,
    workers_seen,
)
from jobrun._core.operator.workers import (
    PRESENCE_APPLICATION,
    PresenceSeen,
    driver_name,
    drivers_of,
    idle_presences,
    presence_seen,
)
from jobrun._core.port import (
    DEFAULT_MAX_STEP_RESULT_BYTES,
    WRITTEN_PAUSED,
    JobRunStore,
    KeptForDrives,
    OperatorStore,
    ScheduleStore,
    StoreLimits,
    not_watching,
)
from jobrun._core.rules.fair_turns import ClaimTurns
from jobrun._core.rules.pausing import (
    pause_record,
    pause_transition,
    paused_start,
    unpause_transition,
)
from jobrun._core.rules.retry import RetryPolicy
from jobrun._core.rules.transitions import RunChange, patched
from jobrun._core.rules.versions import runs_beyond_code
from jobrun._core.sources import Sources
from jobrun._core.time.clock import Clock, ClockLike, Deadline, as_clock
from jobrun._core.time.wall_steps import boot_instant, lease_instants

__all__ = [
    "CANCELLED",
    "CLAIM_FIELDS",
    "COUNT_CAP",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_INSTANCE",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_STEP_RESULT_BYTES",
    "DUE_KINDS",
    "FAILED",
    "GONE_AFTER_BEATS",
    "JOB_RUN_LIST_MAX",
    "KEEP_CURSOR",
    "LOG_PASSES",
    "MILLI",
    "PARKED_AT",
    "PAUSED",
    "PER_MINUTE",
    "PRESENCE_APPLICATION",
    "PRESENCE_CHECK_INTERVAL_S",
    "PRESENCE_CHECK_TIMEOUT_S",
    "PRESENCE_GRACE_S",
    "PRESENCE_PATTERN",
    "RESOLUTIONS",
    "RUNNING",
    "STRANDED",
    "WRITTEN_PAUSED",
    "ActivityQuery",
    "BootInstant",
    "BootLease",
    "BrowsableStore",
    "Bucket",
    "ClaimRequest",
    "ClaimTurns",
    "Claimed",
    "Clock",
    "ClockLike",
    "Counts",
    "Deadline",
    "DriveError",
    "DriveKeywords",
    "DriveOptions",
    "HealthCounts",
    "HeldLease",
    "HolderIdentity",
    "Host",
    "Job",
    "JobDriveReport",
    "JobLoad",
    "JobPass",
    "JobRegistry",
    "JobRun",
    "JobRunHealth",
    "JobRunStatus",
    "JobRunStore",
    "JobStart",
    "KeptForDrives",
    "LimitUsage",
    "Liveness",
    "LoggingObserver",
    "OperatorStore",
    "OrphanScans",
    "OwedReleases",
    "PassEnd",
    "PassObserver",
    "PassResult",
    "PassStart",
    "PassWatch",
    "PauseRecord",
    "Poll",
    "PresenceSeen",
    "PreviousHolder",
    "RateLimitBucket",
    "Resolution",
    "RetryPolicy",
    "RunChange",
    "RunFilter",
    "RunKey",
    "RunPatch",
    "RunQuery",
    "RunRow",
    "ScheduleRow",
    "ScheduleStore",
    "Sources",
    "StepEnd",
    "StepRow",
    "StoreLimits",
    "UlidMint",
    "Waiting",
    "WorkerRow",
    "actions",
    "activity_query",
    "as_clock",
    "assert_queue_safe",
    "beat_row",
    "boot_held",
    "boot_instant",
    "bucket_cap_milli",
    "bucket_state",
    "buckets_of",
    "check_prune_after",
    "check_start",
    "checked_count",
    "checked_seconds",
    "claim_candidate",
    "claim_transition",
    "count_activity",
    "drive",
    "drive_due_jobs",
    "drive_options",
    "driver_name",
    "drivers_of",
    "due_at",
    "first_id_at",
    "format_instant",
    "get_job_run",
    "group_errors",
    "heartbeat_for",
    "idle_presences",
    "is_cancelled",
    "is_due",
    "is_failed_since",
    "is_int",
    "is_leased",
    "is_live",
    "is_number",
    "is_orphan",
    "is_paused",
    "is_prunable",
    "is_stranded",
    "job_run_list_limit",
    "job_run_of",
    "job_runs",
    "jobs_text",
    "lease_instants",
    "limit_paused_reason",
    "live_run_of",
    "liveness_seen_from",
    "not_watching",
    "observe_all",
    "parked",
    "parse_holder",
    "parse_instant",
    "patched",
    "pause_record",
    "pause_transition",
    "paused_limit_of",
    "paused_start",
    "pausing",
    "presence_seen",
    "progress_of",
    "proof_of_death",
    "prune_by_retention",
    "refill_on_resume",
    "refuse",
    "refuse_type",
    "release_job_lease",
    "retains",
    "run_matches",
    "runs",
    "runs_beyond_code",
    "scheduled_runs",
    "served_jobs",
    "slot_counts",
    "span",
    "starts",
    "starts_later_at",
    "stored_version",
    "sweep_due",
    "take",
    "takeover_note_parts",
    "type_name",
    "unpause_transition",
    "unserved",
    "wait_for_token_s",
    "waiting_of",
    "waiting_since",
    "waits_for_no_one",
    "worker_is_live",
    "workers_seen",
]
