// The read-bandwidth ceiling of bench/model/avx512-zen4-2026-12-07-paired-nibbles.md: an AVX-512
// sum over 1 GiB of floats on 1 and 2 threads, best of 5.
//   gcc -O3 -march=native -fopenmp bench/model/membw.c -o membw && ./membw
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <string.h>
int main(int argc,char**argv){ size_t n=(size_t)1<<28; /* 1 GiB of floats */
 float*a=aligned_alloc(64,n*4); 
 #pragma omp parallel for
 for(size_t i=0;i<n;i++)a[i]=1.0f;
 for(int t=1;t<=2;t++){ omp_set_num_threads(t); double best=0;
  for(int r=0;r<5;r++){ double t0=omp_get_wtime(); float tot=0;
   #pragma omp parallel reduction(+:tot)
   { __m512 s0=_mm512_setzero_ps(),s1=s0,s2=s0,s3=s0;
     #pragma omp for
     for(size_t i=0;i<n;i+=64){ s0=_mm512_add_ps(s0,_mm512_load_ps(a+i)); s1=_mm512_add_ps(s1,_mm512_load_ps(a+i+16)); s2=_mm512_add_ps(s2,_mm512_load_ps(a+i+32)); s3=_mm512_add_ps(s3,_mm512_load_ps(a+i+48)); }
     tot+=_mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0,s1),_mm512_add_ps(s2,s3))); }
   double dt=omp_get_wtime()-t0; double gbs=n*4/dt/1e9; if(gbs>best)best=gbs; if(tot<0)printf("x");}
  printf("%d threads: best %.1f GB/s\n",t,best);} }
