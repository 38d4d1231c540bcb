#!/usr/bin/env bats
# lib/aws/aws_cred.c: every credential source of the chain, and its order,
# against tests/credsrv.py: loopback stand-ins for STS, IMDSv2 and the
# ECS/EKS container endpoint (no emulator of these exists on npm or
# Debian).  They check each request as the real services do: STS verifies
# AssumeRole's SigV4 signature with botocore's signer and answers the XML
# STS documents; IMDS wants the PUT token with its TTL header and refuses
# a GET without the token; the container endpoint wants the authorization
# token; and its /proxy verifies the signature of every service call
# against the keys it issued, so the tests see on the server side which
# principal signed.  Nothing here leaves loopback.

bats_require_minimum_version 1.5.0
load helper

# credsrv_start DIR LIFETIME UPSTREAM: a credsrv.py in DIR; sets SRV and
# SRVLOG.
credsrv_start() {
	local dir=$1
	mkdir -p "$dir"
	echo "eyJhbGciOiJSUzI1NiJ9.web-identity-token.sig" > "$dir/web-token"
	echo "Bearer container-token-123" > "$dir/container-token"
	cat > "$dir/cfg.json" <<-EOF
	{"lifetime": $2, "keys": {"AKIDSOURCE": "sourceSecretValue1234"},
	 "web_token_file": "$dir/web-token", "container_token_file": "$dir/container-token",
	 "upstream": "$3"}
	EOF
	python3 "$BATS_TEST_DIRNAME/credsrv.py" "$dir/cfg.json" "$dir/port" "$dir/log" 3>&- &
	echo $! > "$dir/pid"
	for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
	[ -s "$dir/port" ]
	SRV=http://127.0.0.1:$(cat "$dir/port")
	SRVLOG=$dir/log
	touch "$SRVLOG"
}

# srv EXPR: a Python expression over L, the server's log records.
srv() {
	python3 -c 'import json,sys
L=[json.loads(l) for l in open(sys.argv[1])]
print(eval(sys.argv[2]))' "$SRVLOG" "$1"
}

# one fake AWS and credential server for the file, its request log emptied
# by each test: the tests run one at a time (tests/run.sh)
BATS_NO_PARALLELIZE_WITHIN_FILE=true

setup_file() {
	local d=$BATS_FILE_TMPDIR
	python3 "$BATS_TEST_DIRNAME/awsfake.py" "$d/fake.port" "$d/fake.log" 3>&- &
	echo $! > "$d/fake.pid"
	for _ in $(seq 1 100); do [ -s "$d/fake.port" ] && break; sleep 0.05; done
	credsrv_start "$d/srv" 3600 "http://127.0.0.1:$(cat "$d/fake.port")"
}
teardown_file() {
	kill "$(cat "$BATS_FILE_TMPDIR/fake.pid")" "$(cat "$BATS_FILE_TMPDIR/srv/pid")" 2>/dev/null || true
}
setup() {
	aws_test_env
	unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_WEB_IDENTITY_TOKEN_FILE AWS_ROLE_ARN \
		AWS_ROLE_SESSION_NAME AWS_EC2_METADATA_SERVICE_ENDPOINT AWS_ENDPOINT_URL_STS \
		AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE
	SRV=http://127.0.0.1:$(cat "$BATS_FILE_TMPDIR/srv/port")
	SRVLOG=$BATS_FILE_TMPDIR/srv/log
	: > "$SRVLOG"
	D=$BATS_FILE_TMPDIR/srv
	export AWS_CONFIG_FILE=$BATS_TEST_TMPDIR/config AWS_SHARED_CREDENTIALS_FILE=$BATS_TEST_TMPDIR/credentials
	export AWS_ENDPOINT_URL_STS=$SRV/sts AWS_ENDPOINT_URL_DYNAMODB=$SRV/proxy
	printf '[base]\naws_access_key_id = AKIDSOURCE\naws_secret_access_key = sourceSecretValue1234\n' > "$AWS_SHARED_CREDENTIALS_FILE"
	: > "$AWS_CONFIG_FILE"
	probe() { "$IDEMKIT_TEST_BIN/aws_probe" "$@"; }
	call() { probe dynamodb DynamoDB_20120810.GetItem '{"TableName":"t"}' "$@"; }
}
teardown() {
	if [ -s "$BATS_TEST_TMPDIR/srv2/pid" ]; then kill "$(cat "$BATS_TEST_TMPDIR/srv2/pid")" 2>/dev/null || true; fi
	dynalite_stop
}

# the key a line "source=... key=K" names
key_of() { sed -n 's/.* key=\([^ ]*\)$/\1/p' <<<"${lines[0]}"; }

@test "AssumeRole via source_profile: STS (signature verified by botocore) issues the role's keys, and they sign the call" {
	printf '[profile ops]\nrole_arn = arn:aws:iam::123456789012:role/ops\nsource_profile = base\nexternal_id = ext-42\nrole_session_name = worker-1\n' > "$AWS_CONFIG_FILE"
	AWS_PROFILE=ops run --separate-stderr call
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=assume-role region=us-east-1 endpoint=$SRV/proxy key=ASIASTSASSUM"* ]]
	[ "${lines[1]}" = "rc=0 type= status=200" ]
	k=$(key_of)
	[ "$(srv '[(r["role"], r["session"], r["externalId"], r["signedBy"]) for r in L if r["event"] == "assume-role"]')" = \
	  "[('arn:aws:iam::123456789012:role/ops', 'worker-1', 'ext-42', 'AKIDSOURCE')]" ]
	# the service saw the role's key, verified, not the source's
	[ "$(srv '[(r["key"], r["status"]) for r in L if r["event"] == "call"]')" = "[('$k', 200)]" ]
	if grep -q sourceSecretValue <<<"$output$stderr"; then false; fi
	# a session name STS would refuse is refused here, not cut
	printf '[profile long]\nrole_arn = arn:aws:iam::123456789012:role/ops\nsource_profile = base\nrole_session_name = %s\n' \
		"$(printf 'w%.0s' $(seq 1 65))" >> "$AWS_CONFIG_FILE"
	: > "$SRVLOG"
	AWS_PROFILE=long run --separate-stderr call
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS profile long: role session name: want 2 to 64 characters"* ]]
	[ "$(srv 'len([r for r in L if r["event"] == "assume-role"])')" = 0 ]
}

@test "AssumeRole: a wrong source secret is refused by STS -> 78 naming the error; a role chain signs each hop with the previous role; a loop -> 78" {
	printf '[profile ops]\nrole_arn = arn:aws:iam::123456789012:role/ops\nsource_profile = bad\n' > "$AWS_CONFIG_FILE"
	printf '[bad]\naws_access_key_id = AKIDSOURCE\naws_secret_access_key = notTheRightSecret99\n' >> "$AWS_SHARED_CREDENTIALS_FILE"
	AWS_PROFILE=ops run --separate-stderr call
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS profile ops: sts AssumeRole: SignatureDoesNotMatch: The request signature we calculated"* ]]
	[ "$(srv '[r["code"] for r in L if r["event"] == "refused"]')" = "['SignatureDoesNotMatch']" ]
	if grep -q notTheRightSecret <<<"$output$stderr"; then false; fi

	: > "$SRVLOG"
	printf '[profile top]\nrole_arn = arn:aws:iam::123456789012:role/top\nsource_profile = mid\n[profile mid]\nrole_arn = arn:aws:iam::123456789012:role/mid\nsource_profile = base\n' > "$AWS_CONFIG_FILE"
	AWS_PROFILE=top run --separate-stderr call
	[ "$status" -eq 0 ]
	mid=$(srv '[r["key"] for r in L if r["event"] == "assume-role" and r["role"].endswith("/mid")][0]')
	[ "$(srv '[r["signedBy"] for r in L if r["event"] == "assume-role" and r["role"].endswith("/top")][0]')" = "$mid" ]
	[ "$(srv '[r["key"] for r in L if r["event"] == "call"]')" = "['$(key_of)']" ]

	printf '[profile x]\nrole_arn = arn:aws:iam::123456789012:role/x\nsource_profile = y\n[profile y]\nrole_arn = arn:aws:iam::123456789012:role/y\nsource_profile = x\n' > "$AWS_CONFIG_FILE"
	AWS_PROFILE=x run --separate-stderr call
	[ "$status" -eq 78 ]
	[[ $stderr == *"more than 5 roles in a chain (or a loop)"* ]]
}

@test "web identity from the environment: AssumeRoleWithWebIdentity, unsigned, with the file's token; a wrong token -> 78; AWS_ROLE_ARN alone -> 78" {
	export AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$D/web-token AWS_ROLE_SESSION_NAME=pod-7
	run --separate-stderr call
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=web-identity "*" key=ASIASTSWEBID"* ]]
	[ "$(srv '[(r["role"], r["session"]) for r in L if r["event"] == "web-identity"]')" = "[('arn:aws:iam::123456789012:role/irsa', 'pod-7')]" ]
	[ "$(srv '[r["key"] for r in L if r["event"] == "call"]')" = "['$(key_of)']" ]

	echo wrong-token > "$BATS_TEST_TMPDIR/tok"
	AWS_WEB_IDENTITY_TOKEN_FILE=$BATS_TEST_TMPDIR/tok run --separate-stderr call
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS_ROLE_ARN: sts AssumeRoleWithWebIdentity: InvalidIdentityToken: Couldn't verify the token"* ]]
	unset AWS_WEB_IDENTITY_TOKEN_FILE
	run --separate-stderr call
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS_ROLE_ARN is set but AWS_WEB_IDENTITY_TOKEN_FILE is not"* ]]
}

@test "web identity from a profile: role_arn + web_identity_token_file" {
	printf '[profile eks]\nrole_arn = arn:aws:iam::123456789012:role/eks\nweb_identity_token_file = %s\n' "$D/web-token" > "$AWS_CONFIG_FILE"
	AWS_PROFILE=eks run --separate-stderr call
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=web-identity "* ]]
	[ "$(srv '[r["role"] for r in L if r["event"] == "web-identity"]')" = "['arn:aws:iam::123456789012:role/eks']" ]
}

@test "credential_process: Version 1 JSON; not Version 1, a failing command, exit 75, an unreadable Expiration; stdin stays ours" {
	cat > "$BATS_TEST_TMPDIR/proc" <<-'EOF'
	#!/bin/sh
	# a credential process must not eat the step's stdin (the envelopes)
	if read -r line; then echo "stdin leaked: $line" >&2; exit 9; fi
	case $1 in
	ok) printf '{"Version": 1, "AccessKeyId": "AKIDPROCESS1", "SecretAccessKey": "processSecret123456", "SessionToken": "procTok", "Expiration": "2099-01-01T00:00:00Z"}\n' ;;
	v2) printf '{"Version": 2, "AccessKeyId": "A", "SecretAccessKey": "B"}\n' ;;
	exp) printf '{"Version": 1, "AccessKeyId": "A", "SecretAccessKey": "B", "Expiration": "soon"}\n' ;;
	tmp) exit 75 ;;
	*) echo "vault says no" >&2; exit 1 ;;
	esac
	EOF
	chmod +x "$BATS_TEST_TMPDIR/proc"
	for m in ok v2 exp tmp fail; do
		printf '[profile %s]\ncredential_process = %s %s\n' "$m" "$BATS_TEST_TMPDIR/proc" "$m" >> "$AWS_CONFIG_FILE"
	done
	AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(cat "$BATS_FILE_TMPDIR/fake.port")/ok AWS_PROFILE=ok \
		run --separate-stderr call <<<'{"an":"envelope"}'
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=credential-process "*" key=AKIDPROCESS1" ]]
	[[ $(jget "${lines[2]#response=}" authorization) == "AWS4-HMAC-SHA256 Credential=AKIDPROCESS1/"* ]]
	[ "$(jget "${lines[2]#response=}" securityToken)" = procTok ]
	AWS_PROFILE=v2 run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *'AWS profile v2: credential_process: output is not JSON with "Version": 1'* ]]
	AWS_PROFILE=exp run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"Expiration is not an ISO 8601 time"* ]]
	AWS_PROFILE=tmp run --separate-stderr probe dynamodb
	[ "$status" -eq 75 ]
	[[ $stderr == *"credential_process exited 75"* ]]
	AWS_PROFILE=fail run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"vault says no"* ]]
	[[ $stderr == *"AWS profile fail: credential_process exited 1"* ]]
}

@test "IMDSv2: token PUT with its TTL header, then the role, then its credentials; the stand-in refuses a GET without the token" {
	# the stand-in enforces IMDSv2, so this test can fail
	run curl -s -o /dev/null -w '%{http_code}' "$SRV/latest/meta-data/iam/security-credentials/"
	[ "$output" = 401 ]
	run curl -s -o /dev/null -w '%{http_code}' -X PUT "$SRV/latest/api/token"
	[ "$output" = 400 ]
	: > "$SRVLOG"
	AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=$SRV/ run --separate-stderr call
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=imds "*" key=ASIAIMDS"* ]]
	[ "$(srv '[r["event"] for r in L]')" = "['imds-token', 'issue', 'call']" ]
	[ "$(srv '[r["ttl"] for r in L if r["event"] == "imds-token"]')" = "[21600]" ]
	[ "$(srv '[r["key"] for r in L if r["event"] == "call"]')" = "['$(key_of)']" ]
	# AWS_EC2_METADATA_DISABLED=true: not asked at all, even with the endpoint set
	: > "$SRVLOG"
	AWS_EC2_METADATA_DISABLED=true AWS_EC2_METADATA_SERVICE_ENDPOINT=$SRV run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"no AWS credentials"* ]]
	[ ! -s "$SRVLOG" ]
	# an endpoint that was set but does not answer is transient, not "no credentials"
	AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:1 run --separate-stderr probe dynamodb
	[ "$status" -eq 75 ]
	[[ $stderr == *"instance metadata credentials:"* ]]
}

@test "container credentials: FULL_URI with the token file; only loopback, 169.254.170.2, 169.254.170.23, fd00:ec2::23 pass the host check" {
	export AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token
	AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container run --separate-stderr call
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=container "*" key=ASIACONTAINE"* ]]
	[ "$(srv '[r["key"] for r in L if r["event"] == "call"]')" = "['$(key_of)']" ]
	AWS_CONTAINER_CREDENTIALS_FULL_URI=${SRV/127.0.0.1/localhost}/container run --separate-stderr probe dynamodb
	[ "$status" -eq 0 ]
	AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$BATS_TEST_TMPDIR/none AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE: "* ]]
	: > "$SRVLOG"
	for u in http://192.0.2.1/creds https://192.0.2.1/creds http://169.254.170.3/creds \
	         http://169.254.169.254/creds "http://[fd00:ec2::24]/creds" http://example.com/creds \
	         http://127.0.0.1.nip.io/creds "http://[::ffff:10.0.0.1]/creds"; do
		AWS_CONTAINER_CREDENTIALS_FULL_URI=$u run --separate-stderr probe dynamodb
		echo "$u: $status $stderr"
		[ "$status" -eq 78 ]
		[[ $stderr == *"AWS_CONTAINER_CREDENTIALS_FULL_URI: the host must be a loopback address, 169.254.170.2, 169.254.170.23 or fd00:ec2::23"* ]]
	done
	# ::1 passes the check (nothing listens there: transient, not refused)
	AWS_CONTAINER_CREDENTIALS_FULL_URI="http://[::1]:1/creds" run --separate-stderr probe dynamodb
	[ "$status" -eq 75 ]
	[[ $stderr == *"container credentials:"* ]]
	[ ! -s "$SRVLOG" ]
}

@test "order: env keys beat the profile, env web identity and the container; the profile's role beats env web identity" {
	printf '[profile ops]\nrole_arn = arn:aws:iam::123456789012:role/ops\nsource_profile = base\n' > "$AWS_CONFIG_FILE"
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token
	AWS_ACCESS_KEY_ID=AKIDENV AWS_SECRET_ACCESS_KEY=envSecret12345 AWS_PROFILE=ops \
	AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$D/web-token \
		run --separate-stderr probe dynamodb
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=env "*" key=AKIDENV" ]]
	[[ $stderr == *"AWS_ACCESS_KEY_ID is set: it wins over AWS_PROFILE"* ]]
	[ ! -s "$SRVLOG" ]
	AWS_PROFILE=ops AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$D/web-token \
		run --separate-stderr probe dynamodb
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=assume-role "* ]]
	[ "$(srv '[r["event"] for r in L if r["event"] != "issue"]')" = "['assume-role']" ]
}

@test "order: env web identity beats the profile's keys; credentials-file keys beat credential_process, which beats config-file keys; the profile beats the container" {
	printf '[default]\naws_access_key_id = AKIDCREDFILE\naws_secret_access_key = credFileSecret123\n' >> "$AWS_SHARED_CREDENTIALS_FILE"
	cat > "$AWS_CONFIG_FILE" <<-'EOF'
	[default]
	credential_process = printf '{"Version":1,"AccessKeyId":"AKIDPROC","SecretAccessKey":"procSecret12345"}'
	aws_access_key_id = AKIDCONFIG
	aws_secret_access_key = configSecret123
	EOF
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token
	AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$D/web-token run --separate-stderr probe dynamodb
	[[ ${lines[0]} == "source=web-identity "* ]]
	run --separate-stderr probe dynamodb
	[ "${lines[0]##* key=}" = AKIDCREDFILE ]
	[[ ${lines[0]} == "source=shared-credentials-file "* ]]
	printf '[base]\naws_access_key_id = AKIDSOURCE\naws_secret_access_key = sourceSecretValue1234\n' > "$AWS_SHARED_CREDENTIALS_FILE"
	run --separate-stderr probe dynamodb
	[[ ${lines[0]} == "source=credential-process "*" key=AKIDPROC" ]]
	sed -i '/credential_process/d' "$AWS_CONFIG_FILE"
	run --separate-stderr probe dynamodb
	[[ ${lines[0]} == "source=config-file "*" key=AKIDCONFIG" ]]
	[ "$(srv 'len([r for r in L if r.get("source") == "container"])')" = 0 ]   # the container was never asked
	: > "$AWS_CONFIG_FILE"
	run --separate-stderr probe dynamodb
	[[ ${lines[0]} == "source=container "* ]]
}

@test "order: the container beats IMDS; IMDS is last" {
	export AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=$SRV
	AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token \
		run --separate-stderr probe dynamodb
	[[ ${lines[0]} == "source=container "* ]]
	[ "$(srv '[r["source"] for r in L if r["event"] == "issue"]')" = "['container']" ]
	[ "$(srv 'len([r for r in L if r["event"].startswith("imds")])')" = 0 ]
}

@test "refused, never a fall-back: an SSO profile, login_session, mfa_serial, an unknown credential_source, a role_arn without a source -> 78, even with container and instance credentials at hand" {
	printf '[corp]\naws_access_key_id = AKIDCORP\naws_secret_access_key = corpSecret12345\n' >> "$AWS_SHARED_CREDENTIALS_FILE"
	cat > "$AWS_CONFIG_FILE" <<-'EOF'
	[profile corp]
	sso_session = corp
	sso_account_id = 123456789012
	sso_role_name = Admin
	[sso-session corp]
	sso_start_url = https://corp.awsapps.com/start
	[profile legacy]
	sso_start_url = https://corp.awsapps.com/start
	[profile login]
	login_session = arn:aws:iam::123456789012:user/me
	[profile mfa]
	role_arn = arn:aws:iam::123456789012:role/admin
	source_profile = base
	mfa_serial = arn:aws:iam::123456789012:mfa/me
	[profile cs]
	role_arn = arn:aws:iam::123456789012:role/x
	credential_source = Ec2InstanceMetadataV3
	[profile nosrc]
	role_arn = arn:aws:iam::123456789012:role/x
	[profile both]
	role_arn = arn:aws:iam::123456789012:role/x
	source_profile = base
	credential_source = Environment
	EOF
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token
	export AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=$SRV
	for p in corp:"uses IAM Identity Center (sso_session), which idemkit does not support" \
	         legacy:"uses IAM Identity Center (sso_start_url)" \
	         login:"uses login_session, which idemkit does not support" \
	         mfa:"needs an MFA code (mfa_serial)" \
	         cs:"credential_source Ec2InstanceMetadataV3 is not one of Environment, Ec2InstanceMetadata, EcsContainer" \
	         nosrc:"has role_arn but no source_profile, credential_source or web_identity_token_file" \
	         both:"has both source_profile and credential_source"; do
		AWS_PROFILE=${p%%:*} run --separate-stderr probe dynamodb
		echo "$p: $status $stderr"
		[ "$status" -eq 78 ]
		[[ $stderr == *"AWS profile ${p%%:*} ${p#*:}"* || $stderr == *"AWS profile ${p%%:*}: ${p#*:}"* ]]
	done
	# the default profile may name SSO too: no AWS_PROFILE needed to be refused
	printf '[default]\nsso_session = corp\n' > "$AWS_CONFIG_FILE"
	run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS profile default uses IAM Identity Center"* ]]
	[ ! -s "$SRVLOG" ]    # neither the container nor IMDS was asked
	# a profile that does not exist is refused as well, web identity at hand or not
	AWS_PROFILE=nosuch AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$D/web-token \
		run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"AWS profile nosuch not found"* ]]
	[ ! -s "$SRVLOG" ]
	# an unreadable credentials file is not an empty one
	if [ "$(id -u)" -ne 0 ]; then
		chmod 000 "$AWS_SHARED_CREDENTIALS_FILE"
		run --separate-stderr probe dynamodb
		[ "$status" -eq 78 ]
	fi
}

@test "credential_source: Environment and EcsContainer sign the AssumeRole with those credentials" {
	printf '[profile envrole]\nrole_arn = arn:aws:iam::123456789012:role/e\ncredential_source = Environment\n[profile ecsrole]\nrole_arn = arn:aws:iam::123456789012:role/c\ncredential_source = EcsContainer\n' > "$AWS_CONFIG_FILE"
	AWS_PROFILE=ecsrole AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$D/container-token \
		run --separate-stderr call
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=assume-role "* ]]
	c=$(srv '[r["key"] for r in L if r["event"] == "issue" and r["source"] == "container"][0]')
	[ "$(srv '[r["signedBy"] for r in L if r["event"] == "assume-role"]')" = "['$c']" ]
	# Environment: the variables are the role's source, so with AWS_PROFILE
	# naming that profile the role is assumed, not the keys used as they are
	: > "$SRVLOG"
	AWS_PROFILE=envrole AWS_ACCESS_KEY_ID=AKIDSOURCE AWS_SECRET_ACCESS_KEY=sourceSecretValue1234 run --separate-stderr call
	[ "$status" -eq 0 ]
	[[ ${lines[0]} == "source=assume-role "* ]]
	[ "$(srv '[(r["role"], r["signedBy"]) for r in L if r["event"] == "assume-role"]')" = "[('arn:aws:iam::123456789012:role/e', 'AKIDSOURCE')]" ]
	[ "$(srv '[r["key"] for r in L if r["event"] == "call"]')" = "['$(key_of)']" ]
	AWS_PROFILE=envrole run --separate-stderr probe dynamodb
	[ "$status" -eq 78 ]
	[[ $stderr == *"credential_source Environment: no credentials there"* ]]
}

# refresh_check: the calls all succeeded, each signed by a key this server
# issued (verified), and at least N distinct keys signed them.
refresh_check() {
	[ "$(srv 'sorted(set(r["status"] for r in L if r["event"] == "call"))')" = "[200]" ]
	[ "$(srv 'set(r["key"] for r in L if r["event"] == "call") <= set(r["key"] for r in L if r["event"] == "issue")')" = True ]
	[ "$(srv 'len(set(r["key"] for r in L if r["event"] == "call")) >= '"$1")" = True ]
}

@test "refresh: credentials that live 4 s are fetched again before they expire, from the same source (AssumeRole, web identity, IMDS, credential_process), no call fails" {
	credsrv_start "$BATS_TEST_TMPDIR/srv2" 4 "http://127.0.0.1:$(cat "$BATS_FILE_TMPDIR/fake.port")"
	export AWS_ENDPOINT_URL_STS=$SRV/sts AWS_ENDPOINT_URL_DYNAMODB=$SRV/proxy
	printf '[profile ops]\nrole_arn = arn:aws:iam::123456789012:role/ops\nsource_profile = base\n' > "$AWS_CONFIG_FILE"
	AWS_PROFILE=ops run --separate-stderr call 16 500
	echo "$output $stderr"
	[ "$status" -eq 0 ]
	[ "$(grep -c '^rc=0 ' <<<"$output")" -eq 16 ]
	refresh_check 3
	[ "$(srv 'set(r["signedBy"] for r in L if r["event"] == "assume-role")')" = "{'AKIDSOURCE'}" ]

	: > "$SRVLOG"
	AWS_ROLE_ARN=arn:aws:iam::123456789012:role/irsa AWS_WEB_IDENTITY_TOKEN_FILE=$BATS_TEST_TMPDIR/srv2/web-token \
		run --separate-stderr call 16 500
	[ "$status" -eq 0 ]
	refresh_check 3
	[ "$(srv 'set(r["source"] for r in L if r["event"] == "issue")')" = "{'sts-web-identity'}" ]

	: > "$SRVLOG"
	AWS_EC2_METADATA_DISABLED=false AWS_EC2_METADATA_SERVICE_ENDPOINT=$SRV run --separate-stderr call 16 500
	[ "$status" -eq 0 ]
	refresh_check 3
	[ "$(srv 'set(r["source"] for r in L if r["event"] == "issue")')" = "{'imds'}" ]
	[ "$(srv 'len([r for r in L if r["event"] == "imds-token"])')" = "$(srv 'len([r for r in L if r["event"] == "issue"])')" ]

	# credential_process with an Expiration 4 s ahead: run again, not reused
	cat > "$BATS_TEST_TMPDIR/proc" <<-EOF
	#!/bin/sh
	echo x >> "$BATS_TEST_TMPDIR/proc.runs"
	printf '{"Version": 1, "AccessKeyId": "AKIDPROC%s", "SecretAccessKey": "procSecret1234567", "Expiration": "%s"}' \\
		"\$(wc -l < "$BATS_TEST_TMPDIR/proc.runs")" "\$(date -u -d @\$((\$(date +%s) + 4)) +%Y-%m-%dT%H:%M:%SZ)"
	EOF
	chmod +x "$BATS_TEST_TMPDIR/proc"
	printf '[profile proc]\ncredential_process = %s\n' "$BATS_TEST_TMPDIR/proc" > "$AWS_CONFIG_FILE"
	AWS_PROFILE=proc AWS_ENDPOINT_URL_DYNAMODB=http://127.0.0.1:$(cat "$BATS_FILE_TMPDIR/fake.port")/ok \
		run --separate-stderr call 16 500
	[ "$status" -eq 0 ]
	[ "$(grep -c '^rc=0 ' <<<"$output")" -eq 16 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/proc.runs")" -ge 3 ]
	[ "$(grep -o 'Credential=AKIDPROC[0-9]*' <<<"$output" | sort -u | wc -l)" -ge 3 ]
}

@test "refresh in a long-lived --stream: idemp-claim on dynalite with container credentials that live 6 s outlives several of them; every request signed by a live key" {
	require_node
	dynalite_start
	credsrv_start "$BATS_TEST_TMPDIR/srv2" 6 "$DYNALITE_URL"
	export AWS_ENDPOINT_URL_DYNAMODB=$SRV/proxy
	export AWS_CONTAINER_CREDENTIALS_FULL_URI=$SRV/container AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=$BATS_TEST_TMPDIR/srv2/container-token
	table=creds-$$
	run idemp-init --store "dynamodb:$table"
	[ "$status" -eq 0 ]
	: > "$SRVLOG"
	# 60 charges, one every 0.3 s: the stream lives at least 18 s
	for i in $(seq 1 60); do ev "CHG-REFRESH-$i"; sleep 0.3; done |
		idemp-claim --stream --store "dynamodb:$table" > "$BATS_TEST_TMPDIR/out" 2> "$BATS_TEST_TMPDIR/err"
	rc=$?
	cat "$BATS_TEST_TMPDIR/err"
	[ "$rc" -eq 0 ]
	[ "$(wc -l < "$BATS_TEST_TMPDIR/out")" -eq 60 ]
	[ "$(grep -c '"claim":{"outcome":"ACQUIRED"' "$BATS_TEST_TMPDIR/out")" -eq 60 ]
	# several fetches from the container endpoint, and the calls signed by
	# several of those keys (verified), none refused (an expired key would be)
	[ "$(srv 'len([r for r in L if r["event"] == "issue"])')" -ge 3 ]
	refresh_check 3
	[ "$(srv 'len([r for r in L if r["event"] == "container-refused"])')" = 0 ]
}
