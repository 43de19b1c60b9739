/*
 * retention: the policy's decision for one job (retention.h). Pure: called
 * by gc.c under agent.mu on the maint thread, and by the unit test.
 *
 * A step stays when any of these holds, checked in this order (the first is
 * the reason given): retention is off; it is damaged and no whole step is
 * newer; it is the newest whole committed step (what LATEST names, and what
 * a restore of LATEST reads); it is pinned; a restore or verify is reading
 * it; it is among the last keep_last whole ones; its step is a multiple of
 * keep_every. Everything else goes. A damaged step counts for none of the
 * last keep_last: so many restorable steps are kept.
 */
#include <inttypes.h>
#include <stdio.h>

#include "agent/node/retention.h"

/* Whether whole v[i] is among the k whole steps committed last (ties: the higher step). */
static bool recent(const struct ret_step *v, size_t n, size_t i, unsigned k)
{
	size_t later = 0;

	for (size_t j = 0; j < n && later < k; j++)
		later += !v[j].damaged &&
		         (v[j].time_ns > v[i].time_ns || (v[j].time_ns == v[i].time_ns && j > i));
	return later < k;
}

size_t retention_decide(const struct ret_policy *p, struct ret_step *v, size_t n)
{
	size_t removed = 0, newer = 0; /* whole steps after v[i] */
	bool any_whole_after = false;

	for (size_t i = n; i-- > 0;) {
		struct ret_step *s = &v[i];

		if (p->keep_last == 0)
			s->why = RET_OFF;
		else if (s->damaged && !any_whole_after && !s->pinned && !s->busy)
			s->why = RET_DAMAGED;
		else if (!s->damaged && (s->latest || newer == 0))
			s->why = RET_LATEST;
		else if (s->pinned)
			s->why = RET_PINNED;
		else if (s->busy)
			s->why = RET_BUSY;
		else if (!s->damaged && newer < p->keep_last)
			s->why = RET_LAST;
		else if (!s->damaged && recent(v, n, i, p->keep_last))
			s->why = RET_RECENT;
		else if (p->keep_every > 0 && s->step % p->keep_every == 0)
			s->why = RET_EVERY;
		else
			s->why = RET_REMOVE;
		removed += s->why == RET_REMOVE;
		newer += !s->damaged;
		any_whole_after = any_whole_after || !s->damaged;
	}
	return removed;
}

const char *retention_why(enum ret_why w, const struct ret_policy *p, char *buf, size_t len)
{
	switch (w) {
	case RET_REMOVE:
		snprintf(buf, len, "removed");
		break;
	case RET_OFF:
		snprintf(buf, len, "retention off (keep_last 0)");
		break;
	case RET_LATEST:
		snprintf(buf, len, "LATEST");
		break;
	case RET_PINNED:
		snprintf(buf, len, "pinned");
		break;
	case RET_BUSY:
		snprintf(buf, len, "being restored or verified");
		break;
	case RET_LAST:
		snprintf(buf, len, "last %u", p->keep_last);
		break;
	case RET_RECENT:
		snprintf(buf, len, "last %u committed", p->keep_last);
		break;
	case RET_EVERY:
		snprintf(buf, len, "multiple of %" PRId64, p->keep_every);
		break;
	case RET_DAMAGED:
		snprintf(buf, len, "damaged, and no whole step is newer");
		break;
	default:
		snprintf(buf, len, "?");
		break;
	}
	return buf;
}
