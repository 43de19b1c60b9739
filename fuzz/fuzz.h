/*
 * fuzz.h: what the libFuzzer targets of fuzz/ share. A target feeds one
 * input to one parser, then checks what must hold of anything the parser
 * accepted (FUZZ_CHECK): a broken promise aborts, and libFuzzer keeps the
 * input as a crash, the same as a sanitizer report.
 */
#ifndef CKPT_FUZZ_H
#define CKPT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                      \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#endif /* CKPT_FUZZ_H */
