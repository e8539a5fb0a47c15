/*
 * LD_PRELOAD shim for the benchmark's Garage: sets TCP_NODELAY on every
 * accepted connection.
 *
 * Garage 2.5 leaves Nagle's algorithm on for its S3 connections. A GET whose
 * body is smaller than one loopback segment (~64 KiB) is then held back until
 * the client ACKs the response headers, and the client delays that ACK by
 * 40 ms: every small ranged GET takes ~44 ms (measured: 4 KiB and 16 KiB GETs
 * at 23 requests/s per connection, 64 KiB at 160/s). S3 front ends do not
 * behave like that, and the stall would hide every difference between the
 * systems on small reads, so the harness starts Garage with this shim.
 *
 * Build: cc -shared -fPIC -O2 -o nodelay.so nodelay.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void nodelay(int fd)
{
	int one = 1;
	if (fd >= 0)
		/* Fails harmlessly (EOPNOTSUPP) on non-TCP sockets. */
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int accept(int s, struct sockaddr *addr, socklen_t *len)
{
	static int (*real)(int, struct sockaddr *, socklen_t *);
	if (!real)
		real = (int (*)(int, struct sockaddr *, socklen_t *))dlsym(RTLD_NEXT, "accept");
	int fd = real(s, addr, len);
	nodelay(fd);
	return fd;
}

int accept4(int s, struct sockaddr *addr, socklen_t *len, int flags)
{
	static int (*real)(int, struct sockaddr *, socklen_t *, int);
	if (!real)
		real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
	int fd = real(s, addr, len, flags);
	nodelay(fd);
	return fd;
}
