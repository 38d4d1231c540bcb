/* queue_sqlite.h: the embedded queue's constructor, for the factory
 * (open_queue.c).  Commands use queue.h only. */
#ifndef IK_QUEUE_SQLITE_H
#define IK_QUEUE_SQLITE_H

#include "core/err.h"

struct ik_queue;

/* params is the query string of a sqlite URL ("" when none). */
int ik_queue_sqlite_open(const char *path, const char *name, const char *params,
                         struct ik_queue *q, ik_err *err);

#endif
