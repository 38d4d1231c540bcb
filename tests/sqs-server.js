// tests/sqs-server.js: local-aws-sqs (the pinned npm emulator) on a free
// loopback port.  Prints the port on stdout once it listens; the suite
// kills it by pid.  Usage: node tests/sqs-server.js
const { createSqsServer } = require('local-aws-sqs');

async function main() {
	for (let tries = 0; tries < 20; tries++) {
		// a random high port; on EADDRINUSE pick another
		const port = 20000 + Math.floor(Math.random() * 40000);
		try {
			const server = await createSqsServer({
				port, hostname: '127.0.0.1',
				emulateQueueCreationLifecycle: false,
			});
			if (!server.listening)
				await new Promise((ok, ko) => { server.once('listening', ok); server.once('error', ko); });
			process.stdout.write(`${port}\n`);
			return;
		} catch (e) {
			if (e && e.code === 'EADDRINUSE') continue;
			throw e;
		}
	}
	throw new Error('no free port');
}

main().catch((e) => { console.error(`sqs-server: ${e.message}`); process.exit(1); });
