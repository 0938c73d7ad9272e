/* MPI over whatever the run selects (the tests select Open MPI's ofi MTL
 * with the ulnic provider): a ping-pong whose payloads are checked at
 * 1 B .. 1 MiB, allreduce, alltoall and a ring, every result compared
 * with what it must be. Rank 0 prints "ok <name>" per check and the 8 B
 * round trip; any rank exits 1 at the first wrong answer.
 *
 *   mpi_check            the checks above
 *   mpi_check imb N      Intel MPI Benchmarks' PingPong, Sendrecv,
 *                        Exchange and Bcast patterns (IMB-MPI1's message
 *                        sizes, 0 B and 1 B .. 1 MiB, its repetitions
 *                        down to 4 MiB a size), N times in a row, every
 *                        payload checked; "ok imb round R" after each */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (!(cond)) {                                                \
			fprintf(stderr, "rank %d FAILED line %d: ", rank, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                         \
			fprintf(stderr, "\n");                                \
			MPI_Abort(MPI_COMM_WORLD, 1);                         \
		}                                                             \
	} while (0)

static void pingpong(void)
{
	int peer = rank ^ 1;
	if (peer >= size)
		return;
	char *out = malloc(1 << 20), *in = malloc(1 << 20);
	for (int len = 1; len <= (1 << 20); len *= 4) {
		for (int it = 0; it < 10; it++) {
			for (int i = 0; i < len; i++)
				out[i] = (char)(i * 31 + it + len + rank);
			if (rank < peer) {
				MPI_Send(out, len, MPI_CHAR, peer, it, MPI_COMM_WORLD);
				MPI_Recv(in, len, MPI_CHAR, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else {
				MPI_Recv(in, len, MPI_CHAR, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(out, len, MPI_CHAR, peer, it, MPI_COMM_WORLD);
			}
			for (int i = 0; i < len; i++)
				CHECK(in[i] == (char)(i * 31 + it + len + peer), "len %d byte %d", len, i);
		}
	}
	char b[8] = { 0 };
	double t0 = MPI_Wtime();
	for (int i = 0; i < 200; i++) {
		if (rank < peer) {
			MPI_Send(b, 8, MPI_CHAR, peer, 99, MPI_COMM_WORLD);
			MPI_Recv(b, 8, MPI_CHAR, peer, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			MPI_Recv(b, 8, MPI_CHAR, peer, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(b, 8, MPI_CHAR, peer, 99, MPI_COMM_WORLD);
		}
	}
	double us = (MPI_Wtime() - t0) / 200 * 1e6;
	if (rank == 0)
		printf("ok pingpong 1 B..1 MiB checked; 8 B round trip %.1f us\n", us);
	free(out);
	free(in);
}

/* A payload's byte i: its sender, size, repetition and place. */
static char fill(int from, int len, int rep, int i)
{
	return (char)(i * 7 + len * 3 + rep * 5 + from * 11);
}

static void filled(char *b, int from, int len, int rep)
{
	for (int i = 0; i < len; i++)
		b[i] = fill(from, len, rep, i);
}

static void checked(const char *b, int from, int len, int rep, const char *what)
{
	for (int i = 0; i < len; i++)
		CHECK(b[i] == fill(from, len, rep, i), "%s len %d rep %d byte %d from %d", what, len, rep, i, from);
}

/* IMB-MPI1's repetitions: 1000 for small messages, fewer as they grow
 * (at most 4 MiB moved per size and rank), never fewer than 2. */
static int reps_for(int len)
{
	int r = len ? (4 << 20) / len : 1000;
	return r > 1000 ? 1000 : r < 2 ? 2 : r;
}

/* One round of PingPong (ranks 0 and 1), Sendrecv and Exchange (a
 * periodic chain), Bcast (root moving), at every size. */
static void imb_round(char *out, char *in, char *in2)
{
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	for (int len = 0; len <= (1 << 20); len = len ? len * 2 : 1) {
		int reps = reps_for(len);
		for (int r = 0; r < reps; r++) {
			if (rank < 2 && size >= 2) { /* PingPong */
				if (rank == 0) {
					filled(out, 0, len, r);
					MPI_Send(out, len, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
					MPI_Recv(in, len, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					checked(in, 1, len, r, "pingpong");
				} else {
					MPI_Recv(in, len, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					checked(in, 0, len, r, "pingpong");
					filled(out, 1, len, r);
					MPI_Send(out, len, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
				}
			}
			filled(out, rank, len, r); /* Sendrecv */
			MPI_Sendrecv(out, len, MPI_CHAR, right, 2, in, len, MPI_CHAR, left, 2,
				     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			checked(in, left, len, r, "sendrecv");
			MPI_Request q[4]; /* Exchange */
			MPI_Irecv(in, len, MPI_CHAR, left, 3, MPI_COMM_WORLD, &q[0]);
			MPI_Irecv(in2, len, MPI_CHAR, right, 4, MPI_COMM_WORLD, &q[1]);
			MPI_Isend(out, len, MPI_CHAR, left, 4, MPI_COMM_WORLD, &q[2]);
			MPI_Isend(out, len, MPI_CHAR, right, 3, MPI_COMM_WORLD, &q[3]);
			MPI_Waitall(4, q, MPI_STATUSES_IGNORE);
			checked(in, left, len, r, "exchange from left");
			checked(in2, right, len, r, "exchange from right");
			int root = r % size; /* Bcast */
			if (rank == root)
				filled(in, root, len, r);
			MPI_Bcast(in, len, MPI_CHAR, root, MPI_COMM_WORLD);
			checked(in, root, len, r, "bcast");
		}
	}
}

static void imb(int rounds)
{
	char *out = malloc(1 << 20), *in = malloc(1 << 20), *in2 = malloc(1 << 20);
	CHECK(out && in && in2, "malloc");
	for (int round = 1; round <= rounds; round++) {
		double t0 = MPI_Wtime();
		imb_round(out, in, in2);
		if (rank == 0) {
			printf("ok imb round %d: PingPong, Sendrecv, Exchange, Bcast, 0 B..1 MiB in %.1f s\n",
			       round, MPI_Wtime() - t0);
			fflush(stdout);
		}
	}
	free(out);
	free(in);
	free(in2);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc == 3 && !strcmp(argv[1], "imb")) {
		imb(atoi(argv[2]));
		MPI_Finalize();
		return 0;
	}
	pingpong();

	long v[3] = { rank + 1, rank * rank, -rank }, sum[3];
	MPI_Allreduce(v, sum, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	long n = size;
	CHECK(sum[0] == n * (n + 1) / 2 && sum[1] == (n - 1) * n * (2 * n - 1) / 6 && sum[2] == -n * (n - 1) / 2,
	      "allreduce");
	if (rank == 0)
		printf("ok allreduce\n");

	int count = 1000;
	int *send = malloc(sizeof(int) * count * size), *recv = malloc(sizeof(int) * count * size);
	for (int d = 0; d < size; d++)
		for (int i = 0; i < count; i++)
			send[d * count + i] = rank * 1000003 + d * 1009 + i;
	MPI_Alltoall(send, count, MPI_INT, recv, count, MPI_INT, MPI_COMM_WORLD);
	for (int s = 0; s < size; s++)
		for (int i = 0; i < count; i++)
			CHECK(recv[s * count + i] == s * 1000003 + rank * 1009 + i, "alltoall from %d item %d", s, i);
	if (rank == 0)
		printf("ok alltoall\n");

	int token = rank == 0 ? 1 : 0;
	for (int lap = 0; lap < 3; lap++) {
		int next = (rank + 1) % size, prev = (rank + size - 1) % size;
		if (rank == 0) {
			MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
			MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			CHECK(token == 1 + (lap + 1) * (size - 1) * size / 2 - lap * 0, "ring lap %d token %d", lap, token);
			token = 1 + (lap + 1) * (size - 1) * size / 2;
		} else {
			MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			token += rank;
			MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
		}
	}
	if (rank == 0)
		printf("ok ring\n");
	MPI_Finalize();
	if (rank == 0)
		printf("ok all\n");
	return 0;
}
