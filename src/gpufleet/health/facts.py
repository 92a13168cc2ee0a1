"""Published facts that the fleet generator is built on, each with its source, in one place.

No public dataset pairs GPU telemetry with failure labels (``research/diagnosis.md`` §2.2), so the
generator draws a fleet from these figures. Where a number is our assumption rather than a published
figure, the comment says so; ``docs/health.md`` lists the same table for users.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- failure rate -----------------------------------------------------------------------------------------
# Llama 3 (Dubey et al., "The Llama 3 Herd of Models", 2024, §3.3.4 and Table 5): 419 unexpected
# interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs; 58.7 % of them GPU-related.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_GPU_SHARE = 0.587
#: Unexpected interruptions (all causes) per GPU-hour; each failure kind's rate is this times its share.
INTERRUPTIONS_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
#: GPU-related interruptions per GPU-hour: 419 x 0.587 / (16,384 x 54 x 24) = 1.16e-5, an MTBF of ~9.8
#: years per GPU; on 20,000 GPUs, ~5.6 failures a day.
GPU_FAILURES_PER_GPU_HOUR = INTERRUPTIONS_PER_GPU_HOUR * LLAMA3_GPU_SHARE


@dataclass(frozen=True)
class FailureKind:
    """One way a GPU fails: its share of all interruptions, the XIDs it ends in and its precursor."""

    name: str
    llama3_category: str
    share: float  # share of ALL unexpected interruptions (Llama 3 Table 5)
    xids: tuple[int, ...]  # hard XIDs the failure is logged as (one is drawn per failure)
    precursor: str  # signature of the precursor episode ("none": the failure comes without warning)
    precursor_prob: float  # probability that a failure of this kind shows its precursor (assumption)
    median_lead_h: float  # median length of the precursor episode before the failure (assumption)


# Llama 3 Table 5 GPU categories: faulty GPU 30.1 %, GPU HBM3 memory 17.2 %, GPU SRAM memory 4.5 %,
# GPU system processor 4.1 %, silent data corruption 1.4 %, GPU thermal interface + sensor 1.4 %
# (sum 58.7 %). The split of "faulty GPU" into bus drops, NVLink and hangs, and every precursor
# probability and lead, are our assumptions, chosen from the XID semantics in NVIDIA's Xid catalog
# (research/diagnosis.md §3.2) and from "When GPUs Fail Quietly" (GWDG, arXiv 2603.28781): bus drops
# (XID 79) often come with little numeric warning.
FAILURE_KINDS: tuple[FailureKind, ...] = (
    FailureKind("bus_drop", "faulty GPU", 0.301 * 0.45, (79,), "pcie", 0.55, 48.0),
    FailureKind("nvlink", "faulty GPU", 0.301 * 0.25, (74,), "nvlink", 0.70, 60.0),
    FailureKind("hang", "faulty GPU", 0.301 * 0.30, (46, 109), "none", 0.0, 0.0),
    FailureKind("hbm", "GPU HBM3 memory", 0.172, (48, 95), "hbm", 0.85, 72.0),
    FailureKind("sram", "GPU SRAM memory", 0.045, (140, 48), "sram", 0.50, 36.0),
    FailureKind("gsp", "GPU system processor", 0.041, (119, 120), "app_errors", 0.30, 72.0),
    FailureKind("thermal", "GPU thermal interface + sensor", 0.014, (79,), "thermal", 0.90, 120.0),
)
# Silent data corruption (1.4 %) leaves no telemetry trace and no XID: it is neither generated nor labelled.
SILENT_SHARE = 0.014

# --- precursor codes (NVIDIA Xid catalog; research/diagnosis.md §3.2) ---------------------------------------
XID_REMAP_EVENT = 63  # row-remap / page-retirement recording event
XID_EXCESSIVE_SBE = 92  # high single-bit ECC error rate
XID_CONTAINED = 94  # contained uncorrectable ECC error (Ampere+)
BENIGN_APP_XIDS = (13, 31, 43)  # app exceptions, page faults, channel resets: benign alone

# --- drift (assumptions, each modelled on an operational event operators report) ------------------------------
#: Day (since the fleet's start) around which a new driver rolls out, node by node over ±DRIVER_ROLLOUT_DAYS.
#: The new driver reports XID 92 at a lower single-bit-ECC rate, so healthy "leaky" GPUs start emitting it.
DRIVER_UPGRADE_DAY = 58.0
DRIVER_ROLLOUT_DAYS = 6.0
XID92_SBE_PER_HOUR_OLD = 12
XID92_SBE_PER_HOUR_NEW = 3
#: The new driver's GSP firmware times out more often, and its timeouts come after a run of app-class XIDs:
#: GSP failures (XID 119/120) become GSP_AFTER_UPGRADE_FACTOR times as frequent after the roll-out (the
#: kind's total over the fleet's span stays at its published share) and GSP_PRECURSOR_AFTER of them show the
#: precursor. A new failure pattern that a model trained before the roll-out never saw (assumption; NCSA
#: Delta found the GSP the most vulnerable H100 component, Cui et al. arXiv 2503.11901).
GSP_AFTER_UPGRADE_FACTOR = 6.0
GSP_PRECURSOR_AFTER = 0.8
#: Inlet air warms from spring to summer (the default fleet starts on 1 March): +5 °C over 120 days.
SEASONAL_WARMING_C_PER_DAY = 5.0 / 120.0
#: A maintenance on this day reseats cables on a share of racks badly: their GPUs' benign PCIe replay
#: bursts become more frequent afterwards.
MAINTENANCE_DAY = 80.0
MAINTENANCE_RACK_SHARE = 0.15
#: On those racks a loose cable also throws replay *storms*: every GPU of a node sees a PCIe replay episode
#: at once, shaped like a bus-drop precursor but fading without a failure. Storms per bad-rack node per day
#: after the maintenance (assumption). A model that never saw a storm takes them for precursors; one that
#: did learns that a whole node replaying together is the cable, not the GPU (``pcie_vs_node``).
CABLE_STORMS_PER_NODE_DAY = 0.01
#: Wear-out of the weak batch also shows as benign leakage: single-bit errors that climb over the first half
#: of a ~10-day episode (median; some last weeks) and plateau, without row remaps or contained errors. Its
#: onset hazard rises linearly in time, as the batch's HBM failures do (Titan's batch effect, Ostrouchov et
#: al. SC'20); the share of weak GPUs that start leaking within the fleet's span is an assumption. A model
#: trained early sees few; later they outnumber true HBM precursors.
AGING_LEAK_SHARE = 0.03
AGING_LEAK_MEDIAN_H = 240.0

# --- repair -------------------------------------------------------------------------------------------------
#: Hours a failed GPU is out before a reset or replacement brings it back (assumption: a day and a half,
#: log-normal). Telemetry of a GPU under repair is missing (null), as when it drops off the exporter.
REPAIR_MEDIAN_H = 36.0
