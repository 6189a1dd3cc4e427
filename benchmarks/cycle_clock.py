"""The clock the compiled benchmark harnesses share (bench_kv8_phases.py, bench_avx2_floor.py): C text that a
harness pastes in for `now()` (monotonic seconds) and `seconds_a_cycle(n)`, the seconds of one core cycle measured
by a chain of n dependent adds (one cycle each on any x86-64 core), so that what a harness times reads in cycles
whatever the clock speed of the moment."""

CLOCK_C = r"""
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* the seconds of a cycle: n dependent adds (a cycle each), 32 an iteration */
static double seconds_a_cycle(long n) {
    long x = 0, it = n / 32;
    const double t = now();
#define ADD4 "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
    __asm__ volatile("1:\n\t" ADD4 ADD4 ADD4 ADD4 ADD4 ADD4 ADD4 ADD4 "dec %1\n\tjnz 1b" : "+r"(x), "+r"(it));
#undef ADD4
    return (now() - t) / x;
}
"""
