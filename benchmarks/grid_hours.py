"""The paper grid's training hours from train_bench's printed step times (issue #37,
item 7): `benchmarks.accelerator_check` prints them after its train section and
`--from_log` recomputes them from saved logs."""
from __future__ import annotations

import re

STEP_KIND = {"none": "plain", "evidence": "cer_k1", "evidence_distractor": "cer_k2"}


def step_times(lines: list[str]) -> dict[tuple[str, int], dict[str, float]]:
  """(family, context_len) -> {variant: ms/step} from train_bench's printed lines."""
  out, key = {}, None
  for line in lines:
    m = re.search(r"model (\w+)/\w+ .*context (\d+)", line)
    if m:
      scan = re.search(r"; scan (\w+);", line)   # `--scan_impl` runs: keyed 'ssm:<scan>'
      key = (m.group(1) + (f":{scan.group(1)}" if scan else ""), int(m.group(2)))
      out[key] = {}
      continue
    m = re.match(r"\s*(plain|cer_k\d)\s+([\d.]+)\s+[\d.]+", line)
    if m and key is not None:
      out[key][m.group(1)] = float(m.group(2))
  return out


def grid_hours(lines: list[str]) -> list[str]:
  """The paper grid's (configs/paper.py main) training hours from measured step times.

  Each cell costs num_steps x the measured step time of its family and step kind
  (plain / CER evidence k = 1 / evidence + distractor k = 2) at the longest context
  timed (n = 512 is used for the n = 256 cells too: an upper bound). Not counted:
  compilation, periodic evaluations and the grid's audits (1.4% and 0.9% of the
  FLOPs by scale_bench's count). A family timed in all three step kinds gets its
  hours; the grid's total is printed only when every family has them (a section cut
  short by its time limit names the families it did not reach). A run of the ssm with
  another scan (`--ssm_scan_impls`, keyed 'ssm:<scan>') is priced as the ssm's cells on
  a line of its own, never in the total. Empty when no family is complete.
  """
  from ceu_jax.grid import sweep  # pylint: disable=g-import-not-at-top
  from configs import paper  # pylint: disable=g-import-not-at-top
  times = step_times(lines)
  longest = {}
  for (family, n), t in times.items():
    if n >= longest.get(family, (0, {}))[0] and set(STEP_KIND.values()) <= set(t):
      longest[family] = (n, t)
  if not longest:
    return []
  cells = sweep.expand(paper.get_config())
  hours, missing, alt = {}, [], {}
  for cell in cells:
    c = cell.config
    for key in [k for k in longest if k.partition(":")[0] == c.model.family and ":" in k]:
      alt[key] = alt.get(key, 0.0) + c.train.num_steps * longest[key][1][
          STEP_KIND[c.cer.regularizer]] / 3.6e6      # e.g. 'ssm:chunked': another scan
    if c.model.family not in longest:
      missing += [c.model.family] if c.model.family not in missing else []
      continue
    n, t = longest[c.model.family]
    hours[c.model.family] = (hours.get(c.model.family, 0.0)
                             + c.train.num_steps * t[STEP_KIND[c.cer.regularizer]] / 3.6e6)
  head = (f"paper grid (configs/paper.py main, {len(cells)} cells x "
          f"{cells[0].config.train.num_steps} steps), training steps at the measured step "
          f"times (n = {max(n for n, _ in longest.values())} for every cell; compile, "
          f"evaluations and audits not counted): ")
  out = [head + (f"{sum(hours.values()):,.0f} device-hours" if not missing else
                 f"no total: {', '.join(missing)} not timed in every step kind; "
                 f"the families timed:")]
  out += [f"  {family:<12} {h:8,.1f} h  (ms/step " + ", ".join(
      f"{k} {longest[family][1][k]:.2f}" for k in STEP_KIND.values()) + ")"
          + (f"; instead of {family.partition(':')[0]}'s, not in the total" if ":" in family
             else "")
          + (f" (total with it instead: "
             f"{sum(hours.values()) - hours[family.partition(':')[0]] + h:,.0f} device-hours)"
             if ":" in family and not missing else "")
          for family, h in list(hours.items()) + list(alt.items())]
  return out
