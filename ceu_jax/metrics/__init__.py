"""Host-side metrics of ceu-jax (SPEC §5, §8): correctness, calibration, CEU
summaries, bootstrap CIs and the audit summary. Numpy; the probe names and the CEU
formula come from the engine."""
from ceu_jax.metrics.audit import summarize_audit
from ceu_jax.metrics.audit import summarize_groups
from ceu_jax.metrics.resampling import Aggregate
from ceu_jax.metrics.resampling import bootstrap
from ceu_jax.metrics.resampling import bootstrap_scalar
from ceu_jax.metrics.resampling import mean_ci
from ceu_jax.metrics.resampling import paired_difference_ci
from ceu_jax.metrics.resampling import quantile_ci
from ceu_jax.metrics.calibration import brier_binary
from ceu_jax.metrics.calibration import brier_multiclass
from ceu_jax.metrics.calibration import confidence_from_probs
from ceu_jax.metrics.calibration import ece
from ceu_jax.metrics.calibration import ece_resampled
from ceu_jax.metrics.calibration import nll
from ceu_jax.metrics.calibration import reliability_bins
from ceu_jax.metrics.calibration import teacher_forced_confidence
from ceu_jax.metrics.summary import ceu_distribution
from ceu_jax.metrics.summary import ceu_stats
from ceu_jax.metrics.summary import delta_causal
from ceu_jax.metrics.summary import delta_stats
from ceu_jax.metrics.summary import stabilised_ceu
from ceu_jax.metrics.summary import supported
from ceu_jax.metrics.summary import supported_answer_rate
from ceu_jax.metrics.text import exact_match
from ceu_jax.metrics.text import exact_match_batch
from ceu_jax.metrics.text import normalize_answer
from ceu_jax.metrics.text import teacher_forced_exact_match
from ceu_jax.metrics.text import token_exact_match
from ceu_jax.metrics.text import token_f1
from ceu_jax.metrics.text import token_f1_batch
