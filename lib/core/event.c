/* event.c: ChargeDueEvent v1 validation and fingerprint; see event.h.
 *
 * cJSON turns every number into a double, which cannot tell 2500 from
 * 2500.0 or 1e3, so the amount is checked on its raw text, found by a small
 * scan of the top-level object.  The same scan refuses duplicate business
 * keys, which parsers disagree about, and control characters hidden in the
 * escapes of a business string (cJSON would cut "A\u0000B" to "A").
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "core/event.h"
#include "core/outcome.h"
#include "core/util.h"

#define IK_BODY_MAX (256 * 1024)

/* ISO 4217 alpha-3 codes for currencies a charge can be in (funds, metals,
 * test and "no currency" codes left out). */
static const char *const currencies[] = {
	"AED","AFN","ALL","AMD","ANG","AOA","ARS","AUD","AWG","AZN","BAM","BBD",
	"BDT","BGN","BHD","BIF","BMD","BND","BOB","BRL","BSD","BTN","BWP","BYN",
	"BZD","CAD","CDF","CHF","CLP","CNY","COP","CRC","CUC","CUP","CVE","CZK",
	"DJF","DKK","DOP","DZD","EGP","ERN","ETB","EUR","FJD","FKP","GBP","GEL",
	"GHS","GIP","GMD","GNF","GTQ","GYD","HKD","HNL","HTG","HUF","IDR","ILS",
	"INR","IQD","IRR","ISK","JMD","JOD","JPY","KES","KGS","KHR","KMF","KPW",
	"KRW","KWD","KYD","KZT","LAK","LBP","LKR","LRD","LSL","LYD","MAD","MDL",
	"MGA","MKD","MMK","MNT","MOP","MRU","MUR","MVR","MWK","MXN","MYR","MZN",
	"NAD","NGN","NIO","NOK","NPR","NZD","OMR","PAB","PEN","PGK","PHP","PKR",
	"PLN","PYG","QAR","RON","RSD","RUB","RWF","SAR","SBD","SCR","SDG","SEK",
	"SGD","SHP","SLE","SLL","SOS","SRD","SSP","STN","SVC","SYP","SZL","THB",
	"TJS","TMT","TND","TOP","TRY","TTD","TWD","TZS","UAH","UGX","USD","UYU",
	"UYW","UZS","VED","VES","VND","VUV","WST","XAF","XCD","XCG","XOF","XPF",
	"YER","ZAR","ZMW","ZWG","ZWL",
};

static int
cmp_code(const void *a, const void *b)
{
	return strcmp((const char *)a, *(const char *const *)b);
}

/* A bounded, printable copy of outside text for an error message. */
static const char *
show(const char *s, size_t n, char out[48])
{
	size_t i, j = 0;
	for (i = 0; i < n && j < 40; i++)
		out[j++] = isprint((unsigned char)s[i]) ? s[i] : '?';
	if (i < n) {
		memcpy(out + j, "...", 3);
		j += 3;
	}
	out[j] = '\0';
	return out;
}

static const char *
skip_ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* Skips a JSON string starting at the quote; returns the byte after the
 * closing quote, or NULL.  *escaped is set when it held a backslash. */
static const char *
skip_string(const char *p, const char *e, int *escaped)
{
	*escaped = 0;
	for (p++; p < e; p++) {
		if (*p == '\\') {
			*escaped = 1;
			p++;
		} else if (*p == '"') {
			return p + 1;
		}
	}
	return NULL;
}

/* Skips one JSON value (already known to be valid); NULL if cut short. */
static const char *
skip_value(const char *p, const char *e)
{
	int depth = 0, esc;

	if (p < e && *p == '"')
		return skip_string(p, e, &esc);
	if (p < e && (*p == '{' || *p == '[')) {
		while (p < e) {
			if (*p == '"') {
				if (!(p = skip_string(p, e, &esc)))
					return NULL;
				continue;
			}
			if (*p == '{' || *p == '[')
				depth++;
			else if ((*p == '}' || *p == ']') && --depth == 0)
				return p + 1;
			p++;
		}
		return NULL;
	}
	while (p < e && !strchr(",}] \t\r\n", *p))
		p++;
	return p;
}

static const char *const business[] = {
	"chargeId", "accountId", "amount", "currency", "chargeType", "dueDate",
};
enum { BUSINESS_AMOUNT = 2 };   /* business[BUSINESS_AMOUNT] is "amount" */

static int
hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	    c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Refuses a control character that only appears once the string [p, e)
 * (between its quotes) is unescaped: cJSON hands "ACC-1\u0000EVIL" over as
 * the C string "ACC-1", which would pass every later check.  Raw control
 * bytes were refused before; here the escapes \b \f \n \r \t and \uXXXX of
 * U+0000..U+001F, U+007F and U+0080..U+009F (C0, DEL, C1). */
static int
check_escapes(const char *name, const char *p, const char *e, ik_err *err)
{
	for (; p < e; p++) {
		unsigned cp = 0;

		if (*p != '\\' || p + 1 >= e)
			continue;
		p++;
		if (strchr("bfnrt", *p)) {
			return ik_errf(err, IK_DATAERR,
			    "%s: control character \\%c after unescaping; not allowed", name, *p);
		}
		if (*p != 'u' || e - p < 5)
			continue;
		for (int i = 1; i <= 4; i++) {
			int h = hexval(p[i]);
			if (h < 0)
				break;
			cp = cp << 4 | (unsigned)h;
		}
		if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
			return ik_errf(err, IK_DATAERR,
			    "%s: control character U+%04X after unescaping; not allowed", name, cp);
		p += 4;
	}
	return IK_OK;
}

/* Finds the raw text of the top-level "amount" and refuses duplicate or
 * escaped business keys.  The body is already known to be a valid object. */
static int
scan_top(const char *p, const char *e, const char **amt, size_t *amtlen, ik_err *err)
{
	int seen[sizeof business / sizeof business[0]] = { 0 };

	*amt = NULL;
	p = skip_ws(p, e);
	if (p >= e || *p != '{')
		return ik_errf(err, IK_DATAERR, "body: not a JSON object");
	p = skip_ws(p + 1, e);
	while (p < e && *p == '"') {
		const char *k = p + 1, *v;
		int esc;
		size_t kl;

		if (!(p = skip_string(p, e, &esc)))
			break;
		kl = (size_t)(p - 1 - k);
		p = skip_ws(p, e);
		if (p >= e || *p != ':')
			break;
		v = skip_ws(p + 1, e);
		if (!(p = skip_value(v, e)))
			break;
		for (size_t i = 0; i < sizeof business / sizeof business[0]; i++) {
			if (strlen(business[i]) != kl || memcmp(k, business[i], kl))
				continue;
			if (seen[i]++)
				return ik_errf(err, IK_DATAERR, "%s: appears more than once", business[i]);
			if (*v == '"' && check_escapes(business[i], v + 1, p - 1, err))
				return IK_DATAERR;
			if (i == BUSINESS_AMOUNT) {
				const char *ve = v;
				while (ve < p && !strchr(",} \t\r\n", *ve))
					ve++;
				*amt = v;
				*amtlen = (size_t)(ve - v);
			}
		}
		if (esc) {
			/* "\u0061mount" would decode to a business key behind our back. */
			for (size_t i = 0; i < kl; i++)
				if (k[i] == '\\')
					return ik_errf(err, IK_DATAERR,
					    "body: escaped characters in a field name are not accepted");
		}
		p = skip_ws(p, e);
		if (p < e && *p == ',')
			p = skip_ws(p + 1, e);
	}
	return IK_OK;
}

int
ik_id_check(const char *name, const char *s, size_t max, ik_err *err)
{
	size_t n = strlen(s);
	char buf[48];

	if (n == 0)
		return ik_errf(err, IK_DATAERR, "%s: empty", name);
	if (n > max)
		return ik_errf(err, IK_DATAERR, "%s: %zu characters, at most %zu allowed",
		    name, n, max);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (!isalnum(c) && c != '.' && c != '_' && c != ':' && c != '-')
			return ik_errf(err, IK_DATAERR,
			    "%s: character %zu of \"%s\" is not in [A-Za-z0-9._:-]",
			    name, i + 1, show(s, n, buf));
	}
	return IK_OK;
}

static int
check_id(const cJSON *o, const char *name, size_t max, char *out, ik_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);

	if (!it || cJSON_IsNull(it))
		return ik_errf(err, IK_DATAERR, "%s: missing", name);
	if (!cJSON_IsString(it))
		return ik_errf(err, IK_DATAERR, "%s: must be a string", name);
	if (ik_id_check(name, it->valuestring, max, err) != IK_OK)
		return err->code;
	memcpy(out, it->valuestring, strlen(it->valuestring) + 1);
	return IK_OK;
}

static int
check_amount(const char *raw, size_t n, const cJSON *it, long long *out, ik_err *err)
{
	char buf[48];
	long long v = 0;
	size_t i = 0;

	if (!it || cJSON_IsNull(it))
		return ik_errf(err, IK_DATAERR, "amount: missing");
	if (cJSON_IsString(it))
		return ik_errf(err, IK_DATAERR,
		    "amount: must be a JSON integer of minor units, not a string");
	if (!cJSON_IsNumber(it) || !raw)
		return ik_errf(err, IK_DATAERR, "amount: must be a JSON integer of minor units");
	show(raw, n, buf);
	if (memchr(raw, '.', n))
		return ik_errf(err, IK_DATAERR,
		    "amount: fraction not allowed (%s); amounts are integer minor units", buf);
	if (memchr(raw, 'e', n) || memchr(raw, 'E', n))
		return ik_errf(err, IK_DATAERR, "amount: exponent not allowed (%s)", buf);
	if (raw[0] == '-')
		return ik_errf(err, IK_DATAERR, "amount: negative (%s)", buf);
	if (n > 1 && raw[0] == '0')
		return ik_errf(err, IK_DATAERR, "amount: leading zero (%s)", buf);
	if (n > 13)
		return ik_errf(err, IK_DATAERR, "amount: %s exceeds %lld", buf, IK_AMOUNT_MAX);
	for (; i < n; i++) {
		if (raw[i] < '0' || raw[i] > '9')
			return ik_errf(err, IK_DATAERR, "amount: not an integer (%s)", buf);
		v = v * 10 + (raw[i] - '0');
	}
	if (v < 1)
		return ik_errf(err, IK_DATAERR, "amount: must be at least 1 (got %s)", buf);
	if (v > IK_AMOUNT_MAX)
		return ik_errf(err, IK_DATAERR, "amount: %s exceeds %lld", buf, IK_AMOUNT_MAX);
	*out = v;
	return IK_OK;
}

static int
check_currency(const cJSON *o, char out[4], ik_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "currency");
	const char *s;
	char buf[48];

	if (!it || cJSON_IsNull(it))
		return ik_errf(err, IK_DATAERR, "currency: missing");
	if (!cJSON_IsString(it))
		return ik_errf(err, IK_DATAERR, "currency: must be a string");
	s = it->valuestring;
	if (strlen(s) != 3 || !isupper((unsigned char)s[0]) ||
	    !isupper((unsigned char)s[1]) || !isupper((unsigned char)s[2]))
		return ik_errf(err, IK_DATAERR,
		    "currency: \"%s\" is not an ISO 4217 code (3 upper-case letters)",
		    show(s, strlen(s), buf));
	if (!bsearch(s, currencies, sizeof currencies / sizeof currencies[0],
	    sizeof currencies[0], cmp_code))
		return ik_errf(err, IK_DATAERR, "currency: unknown ISO 4217 code \"%s\"", s);
	memcpy(out, s, 4);
	return IK_OK;
}

static int
check_type(const cJSON *o, char *out, ik_err *err)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "chargeType");
	const char *s;
	size_t n;
	char buf[48];

	if (!it || cJSON_IsNull(it))
		return ik_errf(err, IK_DATAERR, "chargeType: missing");
	if (!cJSON_IsString(it))
		return ik_errf(err, IK_DATAERR, "chargeType: must be a string");
	s = it->valuestring;
	n = strlen(s);
	if (n == 0 || n > IK_CHARGE_TYPE_MAX)
		return ik_errf(err, IK_DATAERR, "chargeType: %zu characters, must be 1 to %d",
		    n, IK_CHARGE_TYPE_MAX);
	for (size_t i = 0; i < n; i++)
		if (!isupper((unsigned char)s[i]) && !isdigit((unsigned char)s[i]) && s[i] != '_')
			return ik_errf(err, IK_DATAERR,
			    "chargeType: \"%s\" must match [A-Z0-9_]", show(s, n, buf));
	memcpy(out, s, n + 1);
	return IK_OK;
}

static int
check_date(const cJSON *o, char out[11], ik_err *err)
{
	static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "dueDate");
	const char *s;
	char buf[48];
	int y, m, d;

	out[0] = '\0';
	if (!it || cJSON_IsNull(it))
		return IK_OK;
	if (!cJSON_IsString(it))
		return ik_errf(err, IK_DATAERR, "dueDate: must be a string YYYY-MM-DD");
	s = it->valuestring;
	if (strlen(s) != 10 || s[4] != '-' || s[7] != '-')
		goto bad;
	for (int i = 0; i < 10; i++)
		if (i != 4 && i != 7 && !isdigit((unsigned char)s[i]))
			goto bad;
	y = atoi(s);
	m = atoi(s + 5);
	d = atoi(s + 8);
	if (m < 1 || m > 12 || d < 1 || d > mdays[m - 1] ||
	    (m == 2 && d == 29 && !((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)))
		goto bad;
	memcpy(out, s, 11);
	return IK_OK;
bad:
	return ik_errf(err, IK_DATAERR, "dueDate: \"%s\" is not a date YYYY-MM-DD",
	    show(s, strlen(s), buf));
}

int
ik_event_parse(const char *body, size_t len, struct ik_event *ev, ik_err *err)
{
	const char *end = NULL, *amt;
	size_t amtlen = 0;
	cJSON *o;
	int rc;
	char canon[256];
	unsigned char h[crypto_hash_sha256_BYTES];

	memset(ev, 0, sizeof *ev);
	if (len == 0)
		return ik_errf(err, IK_DATAERR, "body: empty");
	if (len > IK_BODY_MAX)
		return ik_errf(err, IK_DATAERR, "body: %zu bytes, larger than 256 KiB", len);
	if (memchr(body, '\0', len))
		return ik_errf(err, IK_DATAERR, "body: contains a NUL byte");
	/* JSON has no raw control characters (only \t \n \r as whitespace);
	 * cJSON lets them through, in strings too, so refuse them here. */
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)body[i] < 0x20 && !strchr("\t\n\r", body[i]))
			return ik_errf(err, IK_DATAERR, "body: control character 0x%02x at byte %zu",
			    (unsigned char)body[i], i);
	o = cJSON_ParseWithLengthOpts(body, len, &end, 0);
	if (!o)
		return ik_errf(err, IK_DATAERR, "body: not valid JSON");
	if (skip_ws(end, body + len) != body + len) {
		cJSON_Delete(o);
		return ik_errf(err, IK_DATAERR, "body: trailing data after the JSON object");
	}
	if (!cJSON_IsObject(o)) {
		cJSON_Delete(o);
		return ik_errf(err, IK_DATAERR, "body: not a JSON object");
	}
	if ((rc = scan_top(body, body + len, &amt, &amtlen, err)) ||
	    (rc = check_id(o, "chargeId", IK_CHARGE_ID_MAX, ev->charge_id, err)) ||
	    (rc = check_id(o, "accountId", IK_ACCOUNT_ID_MAX, ev->account_id, err)) ||
	    (rc = check_amount(amt, amtlen, cJSON_GetObjectItemCaseSensitive(o, "amount"),
	        &ev->amount, err)) ||
	    (rc = check_currency(o, ev->currency, err)) ||
	    (rc = check_type(o, ev->charge_type, err)) ||
	    (rc = check_date(o, ev->due_date, err))) {
		cJSON_Delete(o);
		return rc;
	}
	cJSON_Delete(o);
	snprintf(canon, sizeof canon, "%s|%lld|%s|%s", ev->account_id, ev->amount,
	    ev->currency, ev->charge_type);
	crypto_hash_sha256(h, (const unsigned char *)canon, strlen(canon));
	ik_hex(h, sizeof h, ev->fingerprint);
	return IK_OK;
}

void
ik_event_peek_id(const char *body, char out[IK_CHARGE_ID_MAX + 1])
{
	cJSON *o = cJSON_Parse(body);
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, "chargeId");
	ik_err e;

	out[0] = '\0';
	if (cJSON_IsObject(o) && it && check_id(o, "chargeId", IK_CHARGE_ID_MAX, out, &e))
		out[0] = '\0';
	cJSON_Delete(o);
}
