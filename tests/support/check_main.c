/*
 * check_main.c: main() for every libcheck test program (check_main.h):
 * test_before, then the program's suite run (CK_NORMAL, so CK_FORK,
 * CK_RUN_CASE and CK_DEFAULT_TIMEOUT apply), then test_after.
 */
#include <stdlib.h>

#include "support/check_main.h"

__attribute__((weak)) int test_before(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	return TEST_RUN;
}

__attribute__((weak)) int test_after(int failed)
{
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int main(int argc, char **argv)
{
	int rc = test_before(argc, argv);
	SRunner *sr;
	int failed;

	if (rc != TEST_RUN)
		return rc;
	sr = srunner_create(test_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return test_after(failed);
}
