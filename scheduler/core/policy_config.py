"""Knobs of the scheduling policy (the `[policy]` and `[network]` tables of gsched.toml)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyConfig:
    arbiter: str = "twostage"  # a name in policies.registry.ARBITERS
    candidates_per_job: int = 4  # stage 1's k
    # Network model: bytes per second by distance.  Same node is free.
    same_rack_bps: float = 25e9 / 8
    cross_rack_bps: float = 10e9 / 8
    # Fair share.
    usage_half_life_s: float = 7 * 24 * 3600.0
    fairshare_weight: float = 1000.0
    age_weight: float = 100.0
    age_max_s: float = 7 * 24 * 3600.0  # age factor saturates at 1.0 after this long pending
    # Delay scheduling: wait up to locality_wait_s (from the first cycle the job waited, not from
    # its submission) for a candidate costing at most locality_threshold_ms before accepting a
    # costlier one.
    # 10 s: in trace replays most waits that end local do so within 10-20 s; longer ones mostly
    # expire (holders run long jobs) and only add queueing (benchmarks/RESULTS.md, quality).
    locality_wait_s: float = 10.0
    locality_threshold_ms: int = 0
    # twostage: jobs whose priorities differ by no more than the age term adds in tie_window_s are
    # ties, broken by transfer cost (local first); 0 keeps the strict priority order.  One hour of
    # age (0.6 priority points at the default weights; fair-share differences stay far larger): in the
    # Philly replay 600 s -> 3600 s took bytes moved 3.19 -> 3.01 TB and local reads 0.922 -> 0.927
    # with mean JCT 16921 -> 16915 s; 4 h gained little more (2.97 TB).
    tie_window_s: float = 3600.0
    # twostage: and users whose fair-share factors differ by no more than tie_fairshare tie too (the
    # tolerance grows by fairshare_weight * tie_fairshare priority points); 0 ties only equal factors.
    # In a queue longer than the cluster every device that frees up goes to the next job, whoever it
    # is, so giving it to one that reads locally there costs fair share little (the usage it adds
    # lowers its user's factor) and saves the staging.  0.2: over the 500-job slices of the quality
    # grid (4 loads x 2 caches, seed 0), cells where twostage's local reads are within 0.02 of the
    # best baseline's 3 -> 12 of 16, bytes within 5 % 3 -> 11, Jain within 0.02 10 -> 10, mean JCT
    # within 2 % 16 -> 14; at 0.4 local 13 and bytes 12 but Jain 7 and mean JCT 13; with every job
    # tied (no bound) Jain in itp_500 at load 2.5 fell 0.877 -> 0.707.
    tie_fairshare: float = 0.2
    # twostage: among tied jobs, those that can read locally go smallest first (devices x time limit,
    # fairshare.job_size), then the others cheapest transfer first; False: every tied job by transfer
    # cost (before 2026-12-07).  Over the quality grid (benchmarks/RESULTS.md, "Ties: local reads
    # first, then the smallest"): mean JCT -2.8 % (geometric mean over the 50 cells, -5.1 % at loads
    # 1.5 and 2.5; no cell more than 0.3 % longer), bytes moved -3.3 %, local reads +0.008, Jain
    # +0.001; within tolerance of the best baseline 48 -> 50 cells on mean JCT.
    tie_shortest_first: bool = True
    # twostage: a pending job that can only start by staging data (no stage-1 candidate within
    # locality_threshold_ms) is ordered as though its user's fair-share factor were stage_penalty
    # lower, so jobs that read locally within that much of its priority (and the tie above) take
    # a device that frees up first; its own priority (explain, the reservation, the starvation bound)
    # is untouched.  flow's trade of staging cost against priority, as a bounded band; 0: off.  Over
    # the quality grid (benchmarks/RESULTS.md, "The staging penalty"), default row within tolerance of the
    # best baseline, mean JCT / p95 / Jain / local / bytes: 50 / 38 / 29 / 37 / 33 at 0 -> 50 / 39 /
    # 28 / 46 / 42 at 0.2, 50 / 37 / 28 / 49 / 48 at 0.3, 50 / 39 / 25 / 49 / 48 at 0.5; at 0.3 bytes
    # -14.5 % and mean JCT -0.3 % (geometric means), Jain -0.006 on average (itp_5000 -0.060).
    stage_penalty: float = 0.3
    # twostage: the reservation (devices held idle so the first gang that fits nowhere can start) is
    # taken only for a job that has been pending at least reserve_min_wait_s (Slurm's
    # bf_min_age_reserve); until then jobs behind it use every free device.  0 reserves at once.
    # A reservation taken at once drained contended clusters for days (itp_5000 at load 2.5: mean JCT
    # 33.4 h, against 13.2 h with none and 14.0 h at 4 days; at 2 days 31.3 h).  8 days (with
    # max_wait_s): at 4 days philly_5000 at load 2.5 had a reservation in 2117 of 4856 cycles and
    # its jobs pending over 4 days staged about 5 of its 8.55 TB; at 8 days mean JCT 66.6 -> 56.9 h, p95
    # 175 -> 148 h, local reads 0.791 -> 0.879, the longest wait unchanged (241 h); the 500-job
    # slices are unchanged.  See benchmarks/RESULTS.md ("Quality on the 5,000-job slices").
    reserve_min_wait_s: float = 8 * 86400.0
    # twostage: the starvation bound.  The job pending longest, once it has been pending max_wait_s,
    # goes first in the order: it starts at once or takes the reservation, so it starts by the end
    # (by time limits) of the jobs running then.  0 turns the bound off.  8 days, with
    # reserve_min_wait_s (above; at 4 days itp_5000's longest wait was 205 h for 20.7 h of mean JCT,
    # at 8 days 248 h for 19.1 h; fifo's longest is 198 h, backfill's 232 h, fairshare's 287 h, flow's 293 h).
    max_wait_s: float = 8 * 86400.0
    # Preemption (policies.preemption): off by default (benchmarks/RESULTS.md: what it does on the
    # quality grid; docs/concepts.md: why it stays off).  A job pending preempt_after_s may take
    # devices from jobs that ran at least min_runtime_s, are preemptible and were preempted fewer than
    # preempt_max_per_hour times in the last hour: from users that keep their fair part of the devices
    # when its user asks for no more than theirs (accounts.fair_parts), or from users over their share
    # when its user is under theirs (factor 0.5; both among the users with jobs: policies.preemption).
    preempt: bool = False
    preempt_after_s: float = 300.0
    min_runtime_s: float = 600.0
    preempt_max_per_hour: int = 2
    # A job preempted k times before is a victim only once it has run min_runtime_s x
    # min_runtime_backoff^k since it last started (1: min_runtime_s alone, as before 2026-12-07), so
    # at 2 a job whose attempts run R seconds in all is preempted at most log2(1 + R / min_runtime_s)
    # times.  In itp_500 at load 2.5 (the six grid cells) the job preempted most went from 12 times to
    # 5, jobs preempted 5 times or more from 53 to 4; over twelve draws Jain the same and mean JCT
    # +5.6 -> +4.7 % against no preemption (benchmarks/RESULTS.md, "Repeat victims").
    min_runtime_backoff: float = 2.0
    # With preemption on, the locality wait is preempt_locality_wait_s instead of locality_wait_s
    # (unless locality_wait_s is 0: never wait).
    # Waiting holds nothing: what others start meanwhile is theirs for the length of their runs
    # (hours), unless preemption can take it back for a user under their share; so with it on a job
    # can afford to wait longer for the nodes that hold its data.  30 minutes: on the quality grid
    # (victims then in 60 s steps), preemption on with a 10 s wait had local reads within 0.02 of the best baseline in 27 of 50
    # cells and bytes within 5 % in 10; with 600 / 1800 / 3600 s, 44 / 46 / 47 and 27 / 35 / 38, mean
    # JCT within 2 % in 46 -> 44 / 45 / 41 cells, Jain 49 in each (benchmarks/RESULTS.md, "The
    # locality wait with preemption").  Without preemption a 1800 s wait costs mean JCT (48 -> 37 cells).
    # Past locality_wait_s the longer wait holds only in a contended cycle (some job found no devices);
    # in any other the job takes free devices nobody asked for (policies/twostage.py take_idle).
    preempt_locality_wait_s: float = 1800.0
    # Victims whose lost work (seconds since their last checkpoint) falls in one step of this many
    # seconds are equals, and among equals those whose nodes hold most of the preemptor's data go
    # first; 0: the least lost work always first.  5 minutes: with the 30-minute wait above, steps of
    # 60 / 300 / 600 s had bytes within 5 % of the best baseline in 35 / 42 / 42 of the grid's 50
    # cells, p95 JCT 36 / 38 / 40, local reads 46 / 46 / 48, mean JCT 45 / 46 / 45, and at most
    # 2.3 / 2.2 / 3.4 % of device time lost to preemption (issue 22 allows 3 %).
    preempt_equal_loss_s: float = 300.0
    # For this long after a job may first preempt (pending preempt_after_s), it takes victims only among
    # the jobs on nodes holding a copy of its data set (policies.preemption.near_data); past it, any:
    # delay scheduling for victims, as preempt_locality_wait_s is for free devices.  0: any at once.
    # 10 minutes: over the quality grid (2026-12-08 02:41) the preemption row's bytes moved -5.7 %
    # (geometric mean), local reads +0.010, mean JCT +0.1 %, p95 -0.5 %, Jain -0.001; within tolerance
    # of the best baseline, mean JCT / p95 / Jain / local / bytes 47 / 38 / 50 / 46 / 25 -> 49 / 38 /
    # 50 / 48 / 29, issue 22's cells 23 -> 24 of 26; at seeds 3-5 (benchmarks.quality_heldout) bytes
    # -5.8 %, local +0.008.  5 / 30 minutes (replays): bytes -6.0 / -6.9 %, mean JCT +0.2 / +0.9 %,
    # Jain -0.001 / -0.003 (benchmarks/RESULTS.md, "Victims on the data's nodes").
    preempt_data_wait_s: float = 600.0
    # A wide job (more devices than its user's fair part of the devices now: the part rule can never
    # start it, and while it waits its user holds nothing) whose devices x time limit is at most that
    # part x preempt_wide_window_s: with preemption on, once its user holds nothing and it has waited
    # preempt_after_s, it takes twostage's reservation at once (not after reserve_min_wait_s), and
    # once running it is not taken by the factor rule.  Averaged over the window its user then holds
    # no more than their part, where waiting would leave them nothing all along.  0: off.  On the
    # quality grid with preemption: itp_500 at load 2.5 (a user's only jobs two 64-device gangs of 0.7
    # and 10.6 h on 160 devices) Jain 0.918-0.926 -> 0.962-0.964 at mean JCT -7..-12 % -> +2..+11 %
    # against the default without preemption; issue 22's cells 20 -> 24 of 26.  A drain, not victims:
    # the wide job preempting for itself gave the same Jain with half again as many preemptions.
    # benchmarks/RESULTS.md, "Wide jobs that fit a part over two days".
    preempt_wide_window_s: float = 2 * 86400.0
    # Weight of transfer cost against priority inside the arbiters that trade them (flow).
    cost_weight: float = 1.0
    # twostage (and the preemption plan): each user's own pending jobs go smallest first (devices x
    # time limit) in the places fair share and age give that user (fairshare.shortest_first): no user
    # gains or loses places.  Over the quality grid, mean JCT -6 to -8 % on philly_500 at loads 1.5
    # and 2.5 and -27 % on philly_5000 (56.9 -> 41.3 h: one user submits half its jobs), the itp_500
    # cells within 1.5 % either way, no summary count lower; with preemption on, philly_5000 64.2 ->
    # 31.8 h.  Measured as well with time limits as users write them (simulator --estimates users):
    # philly_5000 41.9 h.  benchmarks/RESULTS.md, "Each user's own jobs shortest first".
    shortest_first: bool = True

    @property
    def locality_wait(self) -> float:
        """The locality wait in force: ``preempt_locality_wait_s`` with preemption on, else
        ``locality_wait_s``; ``locality_wait_s`` 0 (never wait) holds either way."""
        if self.locality_wait_s <= 0:
            return 0.0
        return self.preempt_locality_wait_s if self.preempt else self.locality_wait_s
