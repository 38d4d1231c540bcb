/* amqp_names.c: what both halves of the RabbitMQ adapter name the same
 * way: the queues a URL declares (the queue, its DLQ, the delivery limit)
 * and the holder's socket address. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "conn/amqp.h"
#include "core/outcome.h"
#include "queue/amqp/amqp_queue.h"

int
ik_amqp_declare_queues(struct amqp_queue *s, struct ik_amqp *a, ik_err *err)
{
	struct ik_amqp_qdecl d = { .quorum = 1, .delivery_limit = -1 };
	int rc;

	if (s->dlq) {
		if ((rc = ik_amqp_declare(a, s->dlq, 0, &d, NULL, err)) != IK_OK)
			return rc;
		d.delivery_limit = s->max_receive - 1;
		d.dlx_key = s->dlq;
		/* a message past its limit leaves the queue only once the DLQ
		 * confirmed it: the default strategy, at most once, loses it
		 * to a broker that dies in that hop */
		d.dl_at_least_once = 1;
	}
	return ik_amqp_declare(a, s->u.queue, 0, &d, NULL, err);
}

socklen_t
ik_amqp_holder_addr(const char *id, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof *sa);
	sa->sun_family = AF_UNIX;
	snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "idemkit-amqp-%s", id);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
	                   strlen(sa->sun_path + 1));
}
