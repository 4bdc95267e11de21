"""Tests of jaxsprint.perf.times: the roofline's smooth corner, the small-batch factor exactly, the split and
traced evaluations of a table agree, and the learner and updater times by their formulas; and of the runtime's
cost form on a host (jaxsprint.calibration.host) by its formulas."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsprint.calibration import host as hf
from jaxsprint.perf import collectives
from jaxsprint.perf import machines as mc
from jaxsprint.perf import networks as nw
from jaxsprint.perf import times, zoo


def test_smooth_max_is_max_up_to_its_corner_width():
    a = jnp.asarray([1.0, 2.0, 10.0, 0.0])
    b = jnp.asarray([0.0, 2.0, 1.0, 3.0])
    got = np.asarray(times.smooth_max(a, b))
    want = np.maximum(np.asarray(a), np.asarray(b))
    assert np.all(got >= want) and np.all(got <= want + times.SMOOTH_MAX_EPS / 2 * np.asarray(a + b) + 1e-6)
    assert float(times.smooth_max(2.0, 2.0)) == pytest.approx(2.0 * (1 + times.SMOOTH_MAX_EPS))
    ga, gb = jax.grad(lambda x, y: times.smooth_max(x, y), argnums=(0, 1))(2.0, 2.0)
    assert float(ga) > 0 and float(gb) > 0  # both sides get gradient at the corner


def test_small_batch_factor_scales_gemm_passes_exactly_and_is_off_at_zero():
    """``half_efficiency_batch`` h multiplies every conv/dense pass by 1 + (h / b)^g; 0 changes nothing."""
    # Memory so fast that every pass is compute-bound, so the factor shows unblended.
    base = mc.with_figures(mc.get("cpu"), memory_bandwidth_bytes_per_s=1e18, half_efficiency_batch=0.0)
    net = zoo.get("resnet8")
    g = float(base.efficiency_sharpness)
    is_gemm = np.isin(np.asarray(net.kind), [nw.KINDS.index(k) for k in ("conv", "dense")])
    for b in (2.0, 8.0, 64.0):
        f0, b0 = times.layer_times_s(net, base, b)
        f1, b1 = times.layer_times_s(net, mc.with_figures(base, half_efficiency_batch=6.0), b)
        factor = 1.0 + (6.0 / b) ** g
        np.testing.assert_allclose(np.asarray(f1)[is_gemm], factor * np.asarray(f0)[is_gemm], rtol=1e-4)
        np.testing.assert_allclose(np.asarray(b1)[is_gemm], factor * np.asarray(b0)[is_gemm], rtol=1e-4)
        np.testing.assert_allclose(np.asarray(f1)[~is_gemm], np.asarray(f0)[~is_gemm], rtol=1e-6)
    # Off: finite gradients (the search's sensitivities differentiate every figure).
    grad = jax.grad(lambda h: times.device_step_time_s(net, mc.with_figures(base, half_efficiency_batch=h), 4.0))(0.0)
    assert np.isfinite(float(grad)) and float(grad) == 0.0


def test_traced_table_gives_the_split_evaluation():
    # A concrete table is evaluated in two parts (GEMM rows, memory-bound rows); a traced one element-wise.
    net, m = zoo.get("resnet20"), mc.get("abci")
    concrete = times.device_step_time_s(net, m, 16.0)
    traced = jax.jit(lambda n: times.device_step_time_s(n, m, 16.0))(net)
    assert float(traced) == pytest.approx(float(concrete), rel=1e-5)


def test_compute_and_update_times_by_their_formulas():
    net, m = zoo.get("resnet50"), mc.get("tsubame_kfc_dl")
    p4 = 4.0 * float(net.total_params)
    tc = float(times.compute_time_s(net, m, 32.0, 8.0))
    expect = (float(times.device_step_time_s(net, m, 32.0))
              + 32 * float(net.input_bytes_per_sample) * 8 / float(m.storage_bandwidth_bytes_per_s)
              + 2 * p4 / float(m.host_device_bandwidth_bytes_per_s))
    assert tc == pytest.approx(expect, rel=1e-5)
    tu = float(times.update_time_s(net, m, 16.0, 8.0))
    ring = float(collectives.allreduce_time_s(p4, 16.0, m.network_latency_s, m.network_bandwidth_bytes_per_s))
    expect = (8 + float(m.updater_passes)) * p4 / float(m.host_memory_bandwidth_bytes_per_s) + ring + float(
        m.updater_overhead_s)
    assert tu == pytest.approx(expect, rel=1e-5)
    # Memory: 4 (3P + b * activations) bytes, and the largest sub-batch that fits.
    b = times.max_sub_batch(net, m)
    assert float(times.memory_bytes(net, b)) <= float(m.device_memory_bytes) < float(times.memory_bytes(net, b + 1))


def _host():
    """The cpu_runtime preset's host figures (jaxsprint.calibration.host: the runtime's cost form)."""
    return hf.load_host(mc.get("cpu_runtime"), "cpu_runtime")


def _smax(*xs):
    k = hf.RUNTIME_SHARPNESS
    return sum(x ** k for x in xs) ** (1 / k)


def _share(n, r):
    """The share of applying cycles at runtime_times' fixed point ``r`` with ``n`` learners, by hand: after an
    empty cycle the next applies with p_e = 1 - exp(-n t_empty / T_c), after an applying one with p_a."""
    rate = n / float(r.t_compute_s)
    p_e, p_a = 1 - np.exp(-rate * float(r.t_update_empty_s)), 1 - np.exp(-rate * float(r.t_update_applying_s))
    return p_e / (1 - p_a + p_e)


def test_the_applying_share_is_that_of_the_updater_loop():
    """applying_share is the share of updates of an updater loop (simulated: each cycle gathers the Poisson
    arrivals of the one before, an empty cycle t_empty long, an applying one t_applying) and, with both kinds
    equally long, the Poisson chance of a non-empty cycle."""
    rng = np.random.default_rng(0)
    for rate, t_e, t_a in ((900.0, 3e-4, 1.7e-3), (300.0, 2.6e-4, 3.5e-3), (50.0, 1e-3, 1e-3), (2e3, 1e-4, 1e-2)):
        applying, last = 0, t_e
        for _ in range(100_000):  # each cycle gathers the arrivals during the last one
            counts = rng.poisson(rate * last)
            last = t_a if counts > 0 else t_e
            applying += counts > 0
        want = float(hf.applying_share(rate, t_e, t_a))
        assert applying / 100_000 == pytest.approx(want, abs=0.01), (rate, t_e, t_a)
        assert 0.0 <= want <= 1.0
    assert float(hf.applying_share(200.0, 2e-3, 2e-3)) == pytest.approx(1 - np.exp(-0.4), rel=1e-6)
    # Long applying cycles beside short empty ones: fewer, fuller updates than the mean count's Poisson chance.
    share = float(hf.applying_share(900.0, 3e-4, 1.7e-3))
    mean = (1 - share) * 3e-4 + share * 1.7e-3
    assert share < float(hf.nonempty_probability(900.0 * mean))


def test_runtime_times_by_their_formulas():
    """The learner cycle is the smooth maximum of its lone cycle, its process's interpreter-lock bound and the
    cores bound (a learner's host work: per cycle and per sample drawn); the updater's own part, stretched on
    co-located hosts, plus the network parts (hand-computed)."""
    net = zoo.get("resnet8")
    g0, gs, p, a, c, cu, sh, kappa = 1.5e-3, 2e-5, 1.5, 2e-3, 1e-3, 0.3, 1.2, 0.2
    g = g0 + 32 * gs  # the host work of a learner cycle at sub-batch 32
    m = mc.with_figures(mc.get("cpu_runtime"), updater_overhead_s=a)
    h = hf.with_figures(_host(), learner_overhead_s=g0, learner_input_per_sample_s=gs, learner_step_cores=p,
                        updater_per_learner_s=c, updater_cores=cu, updater_hosts_stretch=sh, updater_queue=0.0, updater_cv=0.4,
                        updater_apply_s=0.0, learner_step_cores_half_batch=0.0, learner_lock_wait_s=0.0,
                        updater_lock_waits=0.0, updater_shared_wait=0.0, learner_updater_stretch=kappa,
                        updater_sync_per_learner_s=0.0, updater_apply_core_wait_s=0.0)
    p4 = 4.0 * float(net.total_params)
    host = lambda n_h: (n_h + float(m.updater_passes)) * p4 / float(m.host_memory_bandwidth_bytes_per_s)  # noqa
    ring = float(collectives.allreduce_time_s(p4, 2.0, m.network_latency_s, m.network_bandwidth_bytes_per_s))
    # Two hosts x four learners on two cores, 30 ms of network time.
    r = hf.runtime_times(net, m, h, learners_per_host=4, hosts=2, sub_batch=32, network_time_s=0.03)
    share = _share(8, r)  # cycles that read the gradients
    own = (host(4) * share + a + 4 * c) * (1 + sh)
    assert float(r.t_update_s) == pytest.approx(own + 0.03 + ring, rel=1e-5)
    beta = own / (own + 0.03 + ring)
    step = float(times.compute_time_s(net, m, 32.0, 8.0))
    # The lone cycle stretched by both busy updaters, the cores bound with each learner's host work.
    p8 = 1 + (p - 1) * (1 - 2 / 8)  # the extra cores of a busy step grow with the oversubscription, 8 on 2
    t_c = _smax(step * (1 + kappa * 2 * beta) + g, 4 * g / (1 - beta / 2), 8 * (p8 * step + g) / (2 - 2 * beta * cu))
    assert float(r.t_compute_s) == pytest.approx(t_c, rel=1e-5)
    # The two kinds of cycle: an empty one pays no host passes; their mix is the mean.
    empty, applying = float(r.t_update_empty_s), float(r.t_update_applying_s)
    assert empty == pytest.approx((a + 4 * c) * (1 + sh) + 0.03 + ring, rel=1e-5)
    assert applying == pytest.approx(empty + host(4) * (1 + sh), rel=1e-5)
    assert (1 - share) * empty + share * applying == pytest.approx(float(r.t_update_s), rel=1e-5)
    assert float(r.t_update_cv) == pytest.approx(0.4 * own / float(r.t_update_s), rel=1e-5)
    assert float(r.t_compute_cv) == pytest.approx(float(h.learner_cv))
    # One host: no all-reduce and no stretch; one learner alone: its lone cycle dominates.
    one = hf.runtime_times(net, m, h, learners_per_host=1, hosts=1, sub_batch=32, network_time_s=0.0)
    share1 = _share(1, one)  # most cycles empty: no host passes
    assert share1 < 0.5 and float(one.t_update_s) == pytest.approx(host(1) * share1 + a + c, rel=1e-4)
    step1 = float(times.compute_time_s(net, m, 32.0, 1.0))
    # Its updater never sleeps (beta = 1): the step stretched by kappa, the lock bound at g / (1 - 1/2).
    assert float(one.t_compute_s) == pytest.approx(_smax(step1 * (1 + kappa) + g, g / 0.5, (step1 + g) / (2 - cu)),
                                                   rel=1e-5)  # one learner on two cores: no extra cores
    # Separate machines: each host's learners alone on its cores, no stretch.
    apart = hf.runtime_times(net, m, h, learners_per_host=4, hosts=2, sub_batch=32, network_time_s=0.03,
                             co_located=False)
    assert float(apart.t_compute_s) < float(r.t_compute_s)
    share_apart = _share(8, apart)
    assert float(apart.t_update_s) == pytest.approx((host(4) * share_apart + a + 4 * c) + 0.03 + ring, rel=1e-5)
    # Differentiable in the new figures (the search and the calibration take gradients): 8 learners on 2 cores
    # are bound by the cores, so T_c grows about in proportion to the busy step's cores and host work.
    d = jax.grad(lambda x: hf.runtime_times(net, m, hf.with_figures(h, learner_step_cores=x), learners_per_host=4,
                                            hosts=2, sub_batch=32, network_time_s=0.03).t_compute_s)(p)
    share = 0.75 * step / (p8 * step + g)  # d log(p8 step + g) / d p, 8 learners oversubscribing 2 cores
    assert np.isfinite(float(d)) and float(d) == pytest.approx(float(r.t_compute_s) * share, rel=0.05)


def test_runtime_step_cores_grow_with_the_sub_batch():
    """p(b) = 1 + (p - 1) b / (b + b_p): one unit for a tiny step, p for a large one, half-way at b_p; flat at
    b_p = 0 (hand-computed), and the cores bound of T_c scales with its extra cores times the oversubscription."""
    m = hf.with_figures(_host(), learner_step_cores=1.5, learner_step_cores_half_batch=16.0)
    assert float(hf.step_cores(m, 16.0)) == pytest.approx(1.25, rel=1e-6)
    assert float(hf.step_cores(m, 48.0)) == pytest.approx(1.375, rel=1e-6)
    assert float(hf.step_cores(m, 1e6)) == pytest.approx(1.5, rel=1e-4)
    flat = hf.with_figures(m, learner_step_cores_half_batch=0.0)
    assert float(hf.step_cores(flat, 8.0)) == pytest.approx(1.5, rel=1e-6)
    net = zoo.get("resnet8")
    # Sixteen learners on two cores, no host work: the cores bound dominates, in proportion to p(b).
    kw = dict(learners_per_host=16, sub_batch=16, network_time_s=0.05)
    quiet = dict(learner_overhead_s=0.0, learner_input_per_sample_s=0.0, updater_cores=0.0)
    rt = mc.get("cpu_runtime")
    t_half = float(hf.runtime_times(net, rt, hf.with_figures(m, **quiet), **kw).t_compute_s)
    t_flat = float(hf.runtime_times(net, rt, hf.with_figures(flat, **quiet), **kw).t_compute_s)
    over = 1 - 2 / 16  # the extra cores grow with the oversubscription
    assert t_half / t_flat == pytest.approx((1 + 0.25 * over) / (1 + 0.5 * over), rel=1e-3)


def test_runtime_apply_cost_is_paid_by_the_cycles_that_gather_a_gradient():
    """The updater's apply cost comes with the share of non-empty cycles (:func:`_share`): runtime_times
    returns the fixed point (its T_u and T_c satisfy both formulas), nearly the whole cost when every cycle
    gathers gradients and nearly none when almost every cycle is empty (hand-computed)."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    base = hf.with_figures(_host(), updater_apply_s=0.0, updater_hosts_stretch=0.5, updater_queue=0.0,
                           updater_lock_waits=0.0, learner_updater_stretch=0.0,
                           updater_sync_per_learner_s=0.0, updater_apply_core_wait_s=0.0,  # those terms apart
                           updater_per_learner_s=1e-4)  # an empty cycle of 0.1 ms per learner
    t_a = 4e-3
    m = hf.with_figures(base, updater_apply_s=t_a)
    for hosts, per_host, b, net_s in ((2, 4, 32, 0.03), (1, 2, 128, 0.0), (2, 1, 8, 0.0), (1, 8, 64, 0.002)):
        kw = dict(learners_per_host=per_host, hosts=hosts, sub_batch=b, network_time_s=net_s)
        r = hf.runtime_times(net, rt, m, **kw)
        t_c, t_u = float(r.t_compute_s), float(r.t_update_s)
        share = _share(hosts * per_host, r)
        stretch = 1.5 if hosts > 1 else 1.0
        u0 = float(hf.runtime_update_time_s(net, rt, base, hosts, per_host, net_s, sharing_learners=hosts * per_host,
                                            sub_batch=b, nonempty=0.0))
        p4 = 4.0 * float(net.total_params)
        t_host = (per_host + float(rt.updater_passes)) * p4 / float(rt.host_memory_bandwidth_bytes_per_s)
        assert t_u == pytest.approx(u0 + (t_a + t_host) * share * stretch, rel=1e-4)
        ring = float(collectives.allreduce_time_s(p4, float(hosts), rt.network_latency_s,
                                                  rt.network_bandwidth_bytes_per_s)) if hosts > 1 else 0.0
        own = t_u - net_s - ring
        beta = own / t_u
        t_c_formula = float(hf.runtime_compute_time_s(net, rt, m, b, hosts * per_host, learners_per_host=per_host,
                                                      updater_demand=hosts * beta * float(m.updater_cores),
                                                      updater_busy=beta))
        assert t_c == pytest.approx(t_c_formula, rel=1e-3)
    busy = hf.runtime_times(net, rt, m, learners_per_host=8, sub_batch=8, network_time_s=2.0)
    busy0 = hf.runtime_times(net, rt, base, learners_per_host=8, sub_batch=8, network_time_s=2.0)
    assert float(busy.t_update_s) - float(busy0.t_update_s) == pytest.approx(t_a, rel=1e-3)
    idle = hf.runtime_times(net, rt, m, learners_per_host=1, sub_batch=128, network_time_s=0.0)
    idle0 = hf.runtime_times(net, rt, base, learners_per_host=1, sub_batch=128, network_time_s=0.0)
    assert float(idle.t_update_s) - float(idle0.t_update_s) < 0.2 * t_a
    # Differentiable through the fixed point: the gradient matches a central difference.
    def t_u_of(x):
        return hf.runtime_times(net, rt, hf.with_figures(m, updater_apply_s=x), learners_per_host=8, sub_batch=8,
                                network_time_s=0.05).t_update_s

    d, h = float(jax.grad(t_u_of)(t_a)), 2e-4
    assert d == pytest.approx((float(t_u_of(t_a + h)) - float(t_u_of(t_a - h))) / (2 * h), rel=1e-2)
    # Most of these cycles gather gradients (a longer applying cycle also makes the next one likelier to apply).
    assert 0.5 < d < 1.05


def test_runtime_updater_queue_once_the_learners_fill_the_cores():
    """The queue term: q times one device step for each updater program (an applied update, an all-reduce), only
    once the learners alone fill the cores (N >= C), stretched like the rest of the updater's own work on
    co-located hosts; the network part does not change."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    base = hf.with_figures(_host(), updater_queue=0.0, updater_hosts_stretch=1.0)
    m = hf.with_figures(base, updater_queue=0.5)
    step = float(times.compute_time_s(net, rt, 32.0, 2.0))
    kw = dict(sub_batch=32.0, network_time_s=0.02)
    t0 = float(hf.runtime_update_time_s(net, rt, base, 1, 1, **kw))
    assert float(hf.runtime_update_time_s(net, rt, m, 1, 1, **kw)) == pytest.approx(t0, rel=1e-6)  # N < C
    t0 = float(hf.runtime_update_time_s(net, rt, base, 1, 2, **kw))
    t1 = float(hf.runtime_update_time_s(net, rt, m, 1, 2, **kw))
    assert t1 - t0 == pytest.approx(0.5 * step, rel=1e-4)   # N = C
    t0h = float(hf.runtime_update_time_s(net, rt, base, 2, 2, sharing_learners=4, **kw))
    t1h = float(hf.runtime_update_time_s(net, rt, m, 2, 2, sharing_learners=4, **kw))
    # Two programs a cycle (the update, the all-reduce), each x (1 + updater_hosts_stretch).
    assert t1h - t0h == pytest.approx(2.0 * 2.0 * 0.5 * step, rel=1e-4)
    # A cycle that gathers nothing runs no program on one host: no queue.
    e0 = float(hf.runtime_update_time_s(net, rt, base, 1, 2, nonempty=0.0, **kw))
    assert float(hf.runtime_update_time_s(net, rt, m, 1, 2, nonempty=0.0, **kw)) == pytest.approx(e0, rel=1e-6)


def test_smooth_max_has_a_finite_gradient_where_both_are_zero():
    # A two-row XLA table has passes of zero cost; their roofline must not turn the fit's gradient into NaN.
    ga, gb = jax.grad(lambda x, y: times.smooth_max(x, y), argnums=(0, 1))(0.0, 0.0)
    assert np.isfinite(float(ga)) and np.isfinite(float(gb))
    assert float(times.smooth_max(0.0, 0.0)) < 1e-15


def test_runtime_interpreter_lock_waits_by_their_formulas():
    """The updater waits n_L times a cycle behind the learners' host work (rho = N_h g / T_c, an M/M/1 wait
    g rho / (1 - rho)); a learner waits w_L per cycle behind a busy updater (w_L beta in its lone cycle); the
    shared device adds w device steps T_c(b) per update program, w_S after the network's sleep (hand-computed at
    runtime_times' fixed point)."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    g, n_l, w_l, w, w_s = 1e-3, 2.0, 3e-3, 0.25, 0.6
    base = hf.with_figures(_host(), learner_overhead_s=g, learner_input_per_sample_s=0.0, updater_lock_waits=0.0,
                           learner_lock_wait_s=0.0, updater_shared_wait=0.0, updater_shared_sleep_wait=0.0,
                           updater_hosts_stretch=0.0, learner_updater_stretch=0.0)
    m = hf.with_figures(base, updater_lock_waits=n_l, learner_lock_wait_s=w_l, updater_shared_wait=w,
                        updater_shared_sleep_wait=w_s)
    for net_s, wait in ((0.004, w_s), (0.0, w)):
        kw = dict(learners_per_host=6, hosts=1, sub_batch=8, network_time_s=net_s)
        for shared in (0.0, 1.0):
            r = hf.runtime_times(net, rt, m, shared=shared, **kw)
            t_c, t_u = float(r.t_compute_s), float(r.t_update_s)
            share = _share(6, r)
            rho = min(0.95, 6 * g / t_c)
            u0 = float(hf.runtime_update_time_s(net, rt, base, 1, 6, net_s, sub_batch=8.0, nonempty=share))
            step = float(times.compute_time_s(net, rt, 8.0, 6.0))
            assert t_u == pytest.approx(u0 + n_l * g * rho / (1 - rho) + shared * wait * step * share, rel=2e-3)
            beta = (t_u - net_s) / t_u
            p = 1 + (float(hf.step_cores(m, 8.0)) - 1) * (1 - float(m.cores_per_node) / 6)
            want = _smax(step + g + w_l * beta, 6 * g / (1 - beta / 2),
                         6 * (p * step + g) / (float(m.cores_per_node) - beta * float(m.updater_cores)))
            assert t_c == pytest.approx(want, rel=2e-3)
        assert float(hf.runtime_times(net, rt, m, shared=1.0, **kw).t_update_s) > float(
            hf.runtime_times(net, rt, m, **kw).t_update_s)
    # A host's only learner: no wait while the updater cycles back to back (d = 0), w_S after a sleep.
    one = dict(learners_per_host=1, hosts=1, sub_batch=64)
    quiet = hf.with_figures(m, learner_lock_wait_s=0.0, updater_lock_waits=0.0, learner_shared_wait=0.0)
    for net_s, wait in ((0.0, 0.0), (0.03, w_s)):
        r = hf.runtime_times(net, rt, quiet, shared=1.0, network_time_s=net_s, **one)
        r0 = hf.runtime_times(net, rt, quiet, shared=0.0, network_time_s=net_s, **one)
        step = float(times.compute_time_s(net, rt, 64.0, 1.0))
        gained = float(r.t_update_s) - float(r0.t_update_s)
        assert gained == pytest.approx(wait * step * _share(1, r), rel=2e-2, abs=1e-7)


def test_an_updater_cycle_with_every_cost_at_zero_stays_finite():
    """Neutral updater costs, one host, no network: the empty cycle is held at MIN_CYCLE_S, not 0 (no 0/0)."""
    net = zoo.get("resnet8")
    rt = mc.with_figures(mc.get("cpu_runtime"), updater_overhead_s=0.0)
    h = hf.with_figures(_host(), updater_per_learner_s=0.0, updater_lock_waits=0.0, updater_queue=0.0,
                        updater_apply_s=0.0)
    r = hf.runtime_times(net, rt, h, learners_per_host=1, sub_batch=128, network_time_s=0.0)
    assert all(np.isfinite(float(x)) for x in r)
    assert float(r.t_update_empty_s) == pytest.approx(hf.MIN_CYCLE_S)


def test_an_applying_cycle_waits_for_a_core_per_learner_beyond_the_cores():
    """``updater_apply_core_wait_s`` (omega): one host's applying cycle is longer by ``omega (N - C + 1)^+`` than
    without it where the cycle before it slept (network time), by ``(1 - a)`` of that without network time (only
    an apply after an empty cycle waits), its empty cycle not at all; two co-located hosts pay ``z N`` per
    all-reduce instead, not omega."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    base = hf.with_figures(_host(), updater_apply_core_wait_s=0.0, updater_wake_share=0.0)
    omega = 5e-4
    m = hf.with_figures(base, updater_apply_core_wait_s=omega)
    cores = float(base.cores_per_node)
    for hosts, per_host in ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4)):
        for net_s in (0.0, 0.005):
            kw = dict(learners_per_host=per_host, hosts=hosts, sub_batch=8, network_time_s=net_s)
            with_w, without = hf.runtime_times(net, rt, m, **kw), hf.runtime_times(net, rt, base, **kw)
            extra = (float(with_w.t_update_applying_s) - float(with_w.t_update_empty_s)) - (
                float(without.t_update_applying_s) - float(without.t_update_empty_s))
            cold = 1.0 - (_share(per_host * hosts, with_w) if net_s == 0 else 0.0)
            want = omega * max(per_host - cores + 1.0, 0.0) * cold if hosts == 1 else 0.0
            assert extra == pytest.approx(want, rel=1e-3, abs=1e-7), (hosts, per_host, net_s)
            assert float(with_w.t_update_empty_s) == pytest.approx(float(without.t_update_empty_s), rel=1e-5)
            if hosts == 1 and per_host == 8 and net_s == 0:
                assert 0.05 < cold < 0.95  # both kinds of apply: the test sees the share
    # A host section written before the figure existed loads it at its neutral value, 0.
    figures = {f: float(getattr(base, f)) for f in hf.FIELDS if f not in hf.ADDED_LATER}
    old = hf.make_host("old", {}, **figures)
    assert float(old.updater_apply_core_wait_s) == 0.0 and dict(old.sources)["updater_apply_core_wait_s"].startswith(
        "neutral: 0")


def test_a_share_of_the_core_wait_is_paid_on_waking_from_every_sleep():
    """``updater_wake_share`` (f): where the updater sleeps (network time) on one host, every cycle pays ``f omega
    (N - C + 1)^+`` on waking and an applying cycle the rest, so the empty cycle is longer by that and the
    applying one is as long as without it; without network time, or across co-located hosts, nothing changes;
    ``runtime_update_time_s`` agrees with the fixed point's mean cycle."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    omega, share = 5e-4, 0.4
    base = hf.with_figures(_host(), updater_apply_core_wait_s=omega, updater_wake_share=0.0)
    m = hf.with_figures(base, updater_wake_share=share)
    cores = float(base.cores_per_node)
    for hosts, per_host in ((1, 1), (1, 4), (1, 8), (2, 4)):
        for net_s in (0.0, 0.005):
            kw = dict(learners_per_host=per_host, hosts=hosts, sub_batch=8, network_time_s=net_s)
            woke, cold = hf.runtime_times(net, rt, m, **kw), hf.runtime_times(net, rt, base, **kw)
            want = share * omega * max(per_host - cores + 1.0, 0.0) if hosts == 1 and net_s > 0 else 0.0
            empty = float(woke.t_update_empty_s) - float(cold.t_update_empty_s)
            assert empty == pytest.approx(want, rel=1e-3, abs=1e-7), (hosts, per_host, net_s)
            assert float(woke.t_update_applying_s) == pytest.approx(float(cold.t_update_applying_s), rel=1e-4)
            a = _share(per_host * hosts, woke)
            mean = hf.runtime_update_time_s(net, rt, m, hosts, per_host, net_s, sharing_learners=per_host * hosts,
                                            sub_batch=8, nonempty=a)
            assert float(mean) == pytest.approx(float(woke.t_update_s), rel=1e-4), (hosts, per_host, net_s)
            if want:
                assert want > 1e-4  # the case sees the term


def test_the_learner_on_the_updaters_device_waits_behind_its_programs():
    """``learner_shared_wait`` (nu): with the updater on the first learner's device, that learner waits ``nu`` of
    every update program's own time, so the host's mean learner cycle is ``N_h / (N_h - u)`` of the cycle without
    it, ``u = nu a t_apply / T_u`` on one host (``t_apply`` the applying cycle less the empty one where nothing
    else differs); on its own device nothing changes; across hosts the all-reduces add to ``u``."""
    net = zoo.get("resnet8")
    rt = mc.get("cpu_runtime")
    nu = 0.8
    base = hf.with_figures(_host(), learner_shared_wait=0.0, updater_apply_core_wait_s=0.0, updater_wake_share=0.0,
                           updater_shared_wait=0.0, updater_queue=0.0)
    m = hf.with_figures(base, learner_shared_wait=nu)
    for per_host in (1, 2, 4):
        for net_s in (0.0, 0.005):
            kw = dict(learners_per_host=per_host, sub_batch=16, network_time_s=net_s)
            own, own_base = hf.runtime_times(net, rt, m, **kw), hf.runtime_times(net, rt, base, **kw)
            assert float(own.t_compute_s) == pytest.approx(float(own_base.t_compute_s), rel=1e-6)
            r = hf.runtime_times(net, rt, m, shared=1.0, **kw)
            t_u = float(r.t_update_s)
            a = _share(per_host, r)
            u = nu * a * (float(r.t_update_applying_s) - float(r.t_update_empty_s)) / t_u
            beta = (t_u - net_s) / t_u
            raw = hf.runtime_compute_time_s(net, rt, m, 16, per_host, updater_demand=beta * float(m.updater_cores),
                                            updater_busy=beta)
            assert float(r.t_compute_s) == pytest.approx(float(raw) * per_host / (per_host - u), rel=1e-3), (
                per_host, net_s)
            assert u > 0.01  # the case sees the term
    one, two = (hf.runtime_times(net, rt, h, learners_per_host=1, hosts=2, sub_batch=16, shared=1.0)
                for h in (base, m))
    assert float(two.t_compute_s) > 1.01 * float(one.t_compute_s)
