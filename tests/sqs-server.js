// tests/sqs-server.js: local-aws-sqs (the pinned npm emulator) on a free
// loopback port.  Prints the port on stdout once it listens; the suite
// kills it by pid.  Usage: node tests/sqs-server.js
//
// Port 0: the kernel picks a free port, so there is no race to lose.
// (createSqsServer never rejects: a taken port is an unhandled 'error'
// event that kills the process, so picking a random port and retrying on
// EADDRINUSE could not work.)  The emulator learns the port it got and
// builds its QueueUrls with it.
const { createSqsServer } = require('local-aws-sqs');

async function main() {
	const server = await createSqsServer({
		port: 0, hostname: '127.0.0.1',
		emulateQueueCreationLifecycle: false,
	});
	process.stdout.write(`${server.address().port}\n`);
}

main().catch((e) => { console.error(`sqs-server: ${e.message}`); process.exit(1); });
