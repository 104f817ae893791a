"""A torch.profiler run's CUDA kernels grouped by name, per repetition (scripts/profile_round.py, profile_steps.py)."""


def by_kernel(prof, reps: int, unit: str, width: int = 60, copies: bool = True) -> list:
    """Rows {kernel, per_<unit>, us_per_<unit>} (launches and us a repetition), most time first; names cut
    to `width`; copies False leaves memcpy / memset out."""
    by = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        if not copies and ("memcpy" in e.name.lower() or "memset" in e.name.lower()):
            continue
        t = by.setdefault(e.name[:width], [0, 0.0])
        t[0] += 1
        t[1] += e.time_range.end - e.time_range.start
    return sorted(({"kernel": k, f"per_{unit}": c / reps, f"us_per_{unit}": us / reps} for k, (c, us) in by.items()),
                  key=lambda x: -x[f"us_per_{unit}"])


def print_rows(rows: list, unit: str, top: int) -> None:
    for x in rows[:top]:
        print(f"  {x[f'us_per_{unit}']:8.1f} us  {x[f'per_{unit}']:6.1f} x  {x['kernel']}")
