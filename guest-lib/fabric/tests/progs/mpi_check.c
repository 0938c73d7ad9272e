/* MPI over whatever the run selects (the tests select Open MPI's ofi MTL
 * with the ulnic provider): a ping-pong whose payloads are checked at
 * 1 B .. 1 MiB, allreduce, alltoall and a ring, every result compared
 * with what it must be. Rank 0 prints "ok <name>" per check and the 8 B
 * round trip; any rank exits 1 at the first wrong answer. */
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

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
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
