#!/usr/bin/env python3
"""examples/naive-consumer.py: a charge consumer written the way most are,
for the fault campaign to judge (make chaos WORKER=..., docs/RELIABILITY.md).

It is NOT idemkit and not a model: it is the consumer a team already runs,
the kind the campaign is for.  For each message: read it, look its chargeId
up in a DynamoDB table of processed keys, call the bank, send the
notification, write the key, delete the message.  The bank call carries an
Idempotency-Key made fresh for the call and kept across its own retries,
as the usual HTTP clients and payment SDKs do, so a retry inside the call
is safe and a redelivery is a new request.  Nothing here is wrong on a
sunny day; docs/RELIABILITY.md shows what the campaign finds in it, with
the seed that replays it.

Configuration is the campaign's environment, the variables the AWS SDKs
and idemkit read: AWS_REGION, the AWS credentials, AWS_ENDPOINT_URL_SQS and
AWS_ENDPOINT_URL_DYNAMODB, IDEMKIT_QUEUE and
IDEMKIT_DLQ (queue URLs), IDEMKIT_BANK_URL, IDEMKIT_NOTIFY_URL,
IDEMKIT_BANK_CACERT, IDEMKIT_BANK_OAUTH_TOKEN_URL,
IDEMKIT_BANK_OAUTH_CLIENT_ID, IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE;
NAIVE_TABLE names its table of keys (default naive-processed).
Standard library and botocore only (Debian: python3-botocore).
"""
import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
import uuid

import botocore.session
from botocore.config import Config

ENV = os.environ
TABLE = ENV.get("NAIVE_TABLE", "naive-processed")


def log(msg, **kw):
    kw.update(ts=int(time.time() * 1000), prog="naive-consumer", msg=msg)
    print(json.dumps(kw), file=sys.stderr, flush=True)


class Declined(Exception):
    pass


class Bank:
    def __init__(self):
        self.ctx = ssl.create_default_context(cafile=ENV["IDEMKIT_BANK_CACERT"])
        self.ctx.check_hostname = False     # the bank's certificate names its IP
        with open(ENV["IDEMKIT_BANK_OAUTH_CLIENT_SECRET_FILE"]) as f:
            secret = f.read().strip()
        self.basic = base64.b64encode(("%s:%s" % (ENV["IDEMKIT_BANK_OAUTH_CLIENT_ID"],
                                                  secret)).encode()).decode()
        self.token = None

    def fetch_token(self):
        req = urllib.request.Request(ENV["IDEMKIT_BANK_OAUTH_TOKEN_URL"],
                                     data=b"grant_type=client_credentials",
                                     headers={"Authorization": "Basic " + self.basic})
        with urllib.request.urlopen(req, context=self.ctx, timeout=5) as r:
            self.token = json.load(r)["access_token"]

    def post(self, url, doc):
        """POST with an idempotency key of its own, retried (a new token on a
        401, twice more on a 5xx) under that key."""
        key = str(uuid.uuid4())
        for attempt in range(3):
            if self.token is None:
                self.fetch_token()
            req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={
                "Authorization": "Bearer " + self.token, "Idempotency-Key": key,
                "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, context=self.ctx, timeout=5) as r:
                    return json.load(r)
            except urllib.error.HTTPError as e:
                if e.code == 401 and attempt == 0:
                    self.token = None
                    continue
                if e.code in (402, 422):
                    raise Declined(e.code)
                if e.code >= 500 and attempt < 2:
                    time.sleep(0.2)
                    continue
                raise

    def debit(self, ev):
        return self.post(ENV["IDEMKIT_BANK_URL"], ev)["ref"]

    def notify(self, ev, ref):
        self.post(ENV["IDEMKIT_NOTIFY_URL"], {"chargeId": ev["chargeId"],
                                              "accountId": ev["accountId"],
                                              "amount": ev["amount"], "debitRef": ref})


def main():
    s = botocore.session.get_session()
    cfg = Config(connect_timeout=5, read_timeout=10)
    # (Debian 12's botocore, 1.29, predates AWS_ENDPOINT_URL_<SERVICE>)
    region = ENV.get("AWS_REGION")
    sqs = s.create_client("sqs", region_name=region, config=cfg,
                          endpoint_url=ENV.get("AWS_ENDPOINT_URL_SQS"))
    ddb = s.create_client("dynamodb", region_name=region, config=cfg,
                          endpoint_url=ENV.get("AWS_ENDPOINT_URL_DYNAMODB"))
    queue, dlq = ENV["IDEMKIT_QUEUE"], ENV["IDEMKIT_DLQ"]
    try:
        ddb.create_table(TableName=TABLE, BillingMode="PAY_PER_REQUEST",
                         KeySchema=[{"AttributeName": "chargeId", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "chargeId",
                                                "AttributeType": "S"}])
    except ddb.exceptions.ResourceInUseException:
        pass
    bank = Bank()

    def to_dlq(m, why):
        sqs.send_message(QueueUrl=dlq, MessageBody=m["Body"])
        log("dead-lettered", reason=why, messageId=m["MessageId"])

    def handle(m):
        try:
            ev = json.loads(m["Body"])
            key = ev["chargeId"]
        except (ValueError, KeyError, TypeError):
            to_dlq(m, "malformed")
            return
        if "Item" in ddb.get_item(TableName=TABLE, Key={"chargeId": {"S": key}},
                                  ConsistentRead=True):
            log("duplicate", chargeId=key)
            return
        try:
            ref = bank.debit(ev)
        except Declined as e:
            to_dlq(m, "declined %s" % e)
            return
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500:
                to_dlq(m, "rejected %d" % e.code)
                return
            raise
        log("debited", chargeId=key, ref=ref)
        try:
            bank.notify(ev, ref)
        except Exception as e:    # the money moved: a notification is not worth a retry
            log("notification failed", chargeId=key, error=str(e))
        ddb.put_item(TableName=TABLE, Item={"chargeId": {"S": key}, "ref": {"S": ref}})

    while True:
        try:
            got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=1).get("Messages", [])
        except Exception as e:
            log("receive failed", error=str(e))
            time.sleep(1)
            continue
        for m in got:
            try:
                handle(m)
                sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
            except Exception as e:      # left in the queue: it comes back
                log("failed", messageId=m["MessageId"], error=str(e))


if __name__ == "__main__":
    main()
