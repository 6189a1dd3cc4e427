"""The clock the compiled benchmark harnesses share (bench_kv8_phases.py, bench_avx2_floor.py): C text that a
harness pastes in for `now()` (monotonic seconds) and `seconds_a_cycle(n)`, the seconds of one core cycle measured
by a chain of dependent 64-bit multiplies (three cycles each on every x86-64 core since Core 2 and Zen), so that what
a harness times reads in cycles whatever the clock speed of the moment. Not a chain of adds: Intel's cores from Golden
Cove (Sapphire and Emerald Rapids) fold dependent adds of a constant as they rename them, and such a chain read
8.4 GHz on a 2.5 GHz Xeon."""

CLOCK_C = r"""
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
/* the seconds of a cycle: n cycles of dependent multiplies (3 cycles each), 8 an iteration */
static double seconds_a_cycle(long n) {
    long x = 3, it = n / 24;
    const double t = now();
#define MUL4 "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
    __asm__ volatile("1:\n\t" MUL4 MUL4 "dec %1\n\tjnz 1b" : "+r"(x), "+r"(it));
#undef MUL4
    return (now() - t) / (24.0 * (double)(n / 24));
}
"""
