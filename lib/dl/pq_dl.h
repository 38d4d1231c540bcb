/* pq_dl.h: libpq, loaded the first time it is needed (dl.h says why).
 * The pipeline functions (claims and finishes in flight) need libpq 14 or
 * later; Debian 12 ships 15.
 *
 * The files of lib/store/postgres/, libpq's only callers, include this
 * header instead of <libpq-fe.h>, and call ik_pq_load() before any PQ*
 * function.
 */
#ifndef IK_PQ_DL_H
#define IK_PQ_DL_H

#include <libpq-fe.h>

#include "dl/dl.h"

#ifndef IK_LIBPQ
#define IK_LIBPQ "libpq.so.5"
#endif
#ifndef IK_LIBPQ_DEB
#define IK_LIBPQ_DEB "libpq5"
#endif

/* No PQexec, PQexecParams or PQprepare: libpq's blocking calls wait
 * without end on a server that never answers; every statement goes through
 * ik_pg_wait or ik_pg_exec (pg_store.h), bounded by IDEMKIT_PG_TIMEOUT. */
#define IK_PQ_FUNCS(X) \
	X(PQclear) X(PQcmdTuples) X(PQconnectdbParams) X(PQconnectionNeedsPassword) \
	X(PQconninfoFree) X(PQconninfoParse) X(PQerrorMessage) \
	X(PQfinish) X(PQfreemem) X(PQgetisnull) X(PQgetlength) \
	X(PQgetvalue) X(PQntuples) X(PQparameterStatus) X(PQreset) \
	X(PQresultErrorField) \
	X(PQresultStatus) X(PQsetNoticeProcessor) X(PQstatus) \
	X(PQenterPipelineMode) X(PQexitPipelineMode) X(PQpipelineSync) \
	X(PQsendQueryPrepared) X(PQgetResult) X(PQconsumeInput) X(PQisBusy) \
	X(PQsocket) X(PQflush) X(PQpipelineStatus) X(PQsendPrepare) X(PQsendQuery) \
	X(PQsendQueryParams)

struct ik_pq_api {
	IK_PQ_FUNCS(IK_DL_FIELD)
};
extern struct ik_pq_api ik_pq;

/* IK_OK, or IK_CONFIG when libpq or one of its functions is missing. */
int ik_pq_load(ik_err *err);

#ifndef IK_PQ_DL_IMPL  /* pq_dl.c names the symbols themselves */
#define PQclear                   (ik_pq.PQclear)
#define PQcmdTuples               (ik_pq.PQcmdTuples)
#define PQconnectdbParams         (ik_pq.PQconnectdbParams)
#define PQconnectionNeedsPassword (ik_pq.PQconnectionNeedsPassword)
#define PQconninfoFree            (ik_pq.PQconninfoFree)
#define PQconninfoParse           (ik_pq.PQconninfoParse)
#define PQerrorMessage            (ik_pq.PQerrorMessage)
#define PQfinish                  (ik_pq.PQfinish)
#define PQfreemem                 (ik_pq.PQfreemem)
#define PQgetisnull               (ik_pq.PQgetisnull)
#define PQgetlength               (ik_pq.PQgetlength)
#define PQgetvalue                (ik_pq.PQgetvalue)
#define PQntuples                 (ik_pq.PQntuples)
#define PQparameterStatus         (ik_pq.PQparameterStatus)
#define PQreset                   (ik_pq.PQreset)
#define PQresultErrorField        (ik_pq.PQresultErrorField)
#define PQresultStatus            (ik_pq.PQresultStatus)
#define PQsetNoticeProcessor      (ik_pq.PQsetNoticeProcessor)
#define PQstatus                  (ik_pq.PQstatus)
#define PQenterPipelineMode       (ik_pq.PQenterPipelineMode)
#define PQexitPipelineMode        (ik_pq.PQexitPipelineMode)
#define PQpipelineSync            (ik_pq.PQpipelineSync)
#define PQsendQueryPrepared       (ik_pq.PQsendQueryPrepared)
#define PQgetResult               (ik_pq.PQgetResult)
#define PQconsumeInput            (ik_pq.PQconsumeInput)
#define PQisBusy                  (ik_pq.PQisBusy)
#define PQsocket                  (ik_pq.PQsocket)
#define PQflush                   (ik_pq.PQflush)
#define PQpipelineStatus          (ik_pq.PQpipelineStatus)
#define PQsendPrepare             (ik_pq.PQsendPrepare)
#define PQsendQuery               (ik_pq.PQsendQuery)
#define PQsendQueryParams         (ik_pq.PQsendQueryParams)
#endif

#endif
