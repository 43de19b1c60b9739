/*
 * check_main.h: the one main() of every libcheck test program
 * (check_main.c). A test program gives its suite (test_suite), and, where
 * it needs them, two hooks: test_before, run first with the command line
 * (a child role such as --rank or --trainer, a skip where the test cannot
 * run here, the environment set up), and test_after, which says what the
 * run's failures mean (a skip once the cases that could run passed). A
 * program that does not define a hook gets the default.
 *
 * A test that cannot run here exits 77: ctest counts it as skipped.
 */
#ifndef CKPT_TESTS_CHECK_MAIN_H
#define CKPT_TESTS_CHECK_MAIN_H

#include <check.h>
#include <limits.h>

/* test_before's answer that the suite runs (any other is the exit status). */
#define TEST_RUN INT_MIN
/* The exit status of a test that cannot run here. */
#define TEST_SKIP 77

/* The program's suite, made after test_before said TEST_RUN. */
Suite *test_suite(void);

/* Before the suite: TEST_RUN, or the program's exit status. Default: TEST_RUN. */
int test_before(int argc, char **argv);

/* After the run, from the number of checks failed: the exit status. Default: 1 if any. */
int test_after(int failed);

#endif
