/*
 * The agent's events (hub.h): fixed tables of subscribers, filled at start
 * and read from then on. A table that is full is a wiring mistake, caught
 * at the first start (abort) rather than a listener silently not told.
 */
#include <stdio.h>
#include <stdlib.h>

#include "agent/node/hub.h"

static unsigned next(unsigned *n, const char *what)
{
	if (*n >= HUB_MAX) {
		fprintf(stderr, "ckptd: more than %d subscribers of %s\n", HUB_MAX, what);
		abort();
	}
	return (*n)++;
}

void hub_on_save_new(struct hub *h, hub_save_fn fn)
{
	h->made[next(&h->nmade, "a save made")] = fn;
}

void hub_on_save(struct hub *h, hub_save_fn fn)
{
	h->save[next(&h->nsave, "a save's state")] = fn;
}

void hub_on_save_note(struct hub *h, hub_save_fn fn)
{
	h->note[next(&h->nnote, "a save's note")] = fn;
}

void hub_on_ckpt(struct hub *h, hub_ckpt_fn fn)
{
	h->ckpt[next(&h->nckpt, "a checkpoint's end")] = fn;
}

void hub_on_plan(struct hub *h, hub_plan_fn fn)
{
	h->plan[next(&h->nplan, "a plan made or dropped")] = fn;
}

void hub_on_root_back(struct hub *h, hub_root_fn fn)
{
	h->root[next(&h->nroot, "the root back")] = fn;
}

void hub_on_commit_end(struct hub *h, hub_commit_fn fn)
{
	h->commit[next(&h->ncommit, "a commit's end")] = fn;
}

void hub_on_restore_end(struct hub *h, hub_restore_fn fn)
{
	h->restore[next(&h->nrestore, "a restore's end")] = fn;
}

void hub_save_new(const struct hub *h, struct agent *a, struct save *s, enum save_state state)
{
	for (unsigned i = 0; i < h->nmade; i++)
		h->made[i](a, s, state);
}

void hub_save(const struct hub *h, struct agent *a, struct save *s, enum save_state state)
{
	for (unsigned i = 0; i < h->nsave; i++)
		h->save[i](a, s, state);
}

void hub_save_note(const struct hub *h, struct agent *a, struct save *s, enum save_state state)
{
	for (unsigned i = 0; i < h->nnote; i++)
		h->note[i](a, s, state);
}

void hub_ckpt(const struct hub *h, struct agent *a, const struct hub_ckpt *c)
{
	for (unsigned i = 0; i < h->nckpt; i++)
		h->ckpt[i](a, c);
}

void hub_plan(const struct hub *h, struct agent *a, struct plan *p, bool dropped)
{
	for (unsigned i = 0; i < h->nplan; i++)
		h->plan[i](a, p, dropped);
}

void hub_root_back(const struct hub *h, struct agent *a)
{
	for (unsigned i = 0; i < h->nroot; i++)
		h->root[i](a);
}

void hub_commit_end(const struct hub *h, struct agent *a, const struct hub_commit *c)
{
	for (unsigned i = 0; i < h->ncommit; i++)
		h->commit[i](a, c);
}

void hub_restore_end(const struct hub *h, struct agent *a, const struct hub_restore *r)
{
	for (unsigned i = 0; i < h->nrestore; i++)
		h->restore[i](a, r);
}
